//! A scripted API server on `tower_test::mock` for unit tests of the shells that talk to
//! Kubernetes: each expected request in order gets its canned answer; Event writes are
//! answered and recorded on the side.

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// One request the code under test must make next, and the answer it gets.
pub struct Expect {
    pub method: Method,
    /// The path must end with this (query strings are ignored).
    pub path: String,
    pub status: StatusCode,
    /// The answer's body; `Value::Null` answers with the request's own body (what a
    /// create returns).
    pub body: Value,
}

impl Expect {
    pub fn new(method: Method, path: &str, status: StatusCode, body: Value) -> Self {
        Expect {
            method,
            path: path.to_string(),
            status,
            body,
        }
    }
}

/// A request the code under test made.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    /// The query string, empty when there is none.
    pub query: String,
    pub body: Value,
}

/// What the server saw: the scripted requests in order, and the Events published.
#[derive(Debug, Default)]
pub struct Transcript {
    pub requests: Vec<Seen>,
    pub events: Vec<Seen>,
    /// Requests that were not the next expected one (the test fails on any).
    pub unexpected: Vec<Seen>,
    /// Expected requests that never came.
    pub missing: Vec<String>,
}

impl Transcript {
    /// Asserts that every scripted request came, in order, as one paged list: a first page
    /// of [`crate::paging::PAGE`] without a continue token, then one page for each of
    /// `tokens`, continuing from it. Returns the queries.
    pub fn assert_paged(&self, tokens: &[&str]) -> Vec<&str> {
        assert!(
            self.unexpected.is_empty() && self.missing.is_empty(),
            "{self:#?}"
        );
        let q: Vec<&str> = self.requests.iter().map(|r| r.query.as_str()).collect();
        assert_eq!(q.len(), tokens.len() + 1, "{q:?}");
        let limit = format!("limit={}", crate::paging::PAGE);
        assert!(q[0].contains(&limit) && !q[0].contains("continue"), "{q:?}");
        for (query, token) in q[1..].iter().zip(tokens) {
            assert!(query.contains(&format!("continue={token}")), "{q:?}");
        }
        q
    }

    /// Reasons of the Events published, in order.
    pub fn event_reasons(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| e.body["reason"].as_str().map(str::to_string))
            .collect()
    }
}

/// A Kubernetes status body, as the API server answers errors.
/// Discovery of a cluster that serves no DRA (`GET /apis` without `resource.k8s.io`): what a
/// run reads before it makes pods or counts busy GPUs.
pub fn no_dra() -> Expect {
    Expect::new(
        Method::GET,
        "/apis",
        StatusCode::OK,
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
    )
}

pub fn status(code: u16, reason: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("{reason} (scripted)"),
        "reason": reason,
        "code": code,
    })
}

/// The answers to a list of `kind` (e.g. `PodList`) read page by page from `path`: page i
/// holds `pages[i]` and continues with `tokens[i]`, the last page with none. Checked by
/// [`Transcript::assert_paged`] with the same tokens.
pub fn paged_list(
    path: &str,
    api_version: &str,
    kind: &str,
    pages: Vec<Vec<Value>>,
    tokens: &[&str],
) -> Vec<Expect> {
    assert_eq!(pages.len(), tokens.len() + 1, "one token between two pages");
    pages
        .into_iter()
        .enumerate()
        .map(|(i, items)| {
            let next = tokens.get(i).copied().unwrap_or("");
            let body = json!({"apiVersion": api_version, "kind": kind,
                "metadata": {"resourceVersion": "7", "continue": next}, "items": items});
            Expect::new(Method::GET, path, StatusCode::OK, body)
        })
        .collect()
}

/// A client whose requests `serve` answers.
pub fn client() -> (Client, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), handle)
}

/// Answers requests until every client clone is dropped; returns what it saw.
pub fn serve(handle: Handle, script: Vec<Expect>) -> tokio::task::JoinHandle<Transcript> {
    serve_matching(handle, script, false)
}

/// [`serve`] for code that makes requests at once: each request gets the answer of the
/// first expected request not yet answered with its method and path, in whatever order
/// they come (the transcript keeps the order they came in).
pub fn serve_any_order(handle: Handle, script: Vec<Expect>) -> tokio::task::JoinHandle<Transcript> {
    serve_matching(handle, script, true)
}

fn serve_matching(
    mut handle: Handle,
    script: Vec<Expect>,
    any_order: bool,
) -> tokio::task::JoinHandle<Transcript> {
    tokio::spawn(async move {
        let mut script: std::collections::VecDeque<Expect> = script.into();
        let mut seen = Transcript::default();
        while let Some((request, respond)) = handle.next_request().await {
            let method = request.method().clone();
            let path = request.uri().path().to_string();
            let query = request.uri().query().unwrap_or_default().to_string();
            let bytes = request
                .into_body()
                .collect_bytes()
                .await
                .unwrap_or_default();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let request = Seen {
                method,
                path,
                query,
                body,
            };
            let (code, answer) = if request.path.contains("/events") {
                let echo = request.body.clone();
                seen.events.push(request);
                (StatusCode::CREATED, echo)
            } else {
                let next = if any_order {
                    script
                        .iter()
                        .position(|e| e.method == request.method && request.path.ends_with(&e.path))
                        .and_then(|i| script.remove(i))
                } else {
                    script.pop_front()
                };
                match next {
                    Some(e) if e.method == request.method && request.path.ends_with(&e.path) => {
                        let answer = if e.body.is_null() {
                            request.body.clone()
                        } else {
                            e.body
                        };
                        seen.requests.push(request);
                        (e.status, answer)
                    }
                    other => {
                        if let Some(e) = other {
                            seen.missing.push(format!("{} {}", e.method, e.path));
                        }
                        seen.unexpected.push(request);
                        (StatusCode::INTERNAL_SERVER_ERROR, status(500, "Unexpected"))
                    }
                }
            };
            let response = Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&answer).unwrap_or_default()));
            if let Ok(r) = response {
                respond.send_response(r);
            }
        }
        seen.missing.extend(
            script
                .into_iter()
                .map(|e| format!("{} {}", e.method, e.path)),
        );
        seen
    })
}
