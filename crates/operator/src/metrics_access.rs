//! Who may read `/metrics`: as kube-rbac-proxy and controller-runtime's metrics filter do, the
//! caller's bearer token is reviewed by the API server (TokenReview) and the identity it
//! names must be allowed `get` on the non-resource URL `/metrics` (SubjectAccessReview).

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

/// The path, and the non-resource URL a reader needs `get` on.
pub const METRICS_PATH: &str = "/metrics";

/// Who may read `/metrics`.
#[derive(Clone)]
pub enum MetricsAccess {
    /// Anyone who reaches the port (for a port only the node or a test reaches).
    Open,
    /// A bearer token the API server accepts, of an identity allowed `get` on `/metrics`.
    Kubernetes(Client),
}

impl std::fmt::Debug for MetricsAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MetricsAccess::Open => "Open",
            MetricsAccess::Kubernetes(_) => "Kubernetes",
        })
    }
}

/// Why a request for `/metrics` was turned away.
#[derive(Debug, thiserror::Error)]
pub enum Denied {
    #[error(
        "no bearer token: send `Authorization: Bearer <token>` of an identity allowed get on {METRICS_PATH}"
    )]
    NoToken,
    #[error("the API server did not accept the token{}", reason(.0))]
    Unauthenticated(Option<String>),
    #[error("{user} may not get {METRICS_PATH}: bind it to the chart's metrics-reader ClusterRole")]
    Forbidden { user: String },
    #[error("could not review the token with the API server: {0}")]
    Review(#[from] kube::Error),
}

fn reason(r: &Option<String>) -> String {
    r.as_ref()
        .filter(|r| !r.is_empty())
        .map_or_else(String::new, |r| format!(": {r}"))
}

impl Denied {
    /// The HTTP status of the refusal: 401 without a valid token, 403 without the right,
    /// 503 when the API server could not be asked.
    pub fn status(&self) -> u16 {
        match self {
            Denied::NoToken | Denied::Unauthenticated(_) => 401,
            Denied::Forbidden { .. } => 403,
            Denied::Review(_) => 503,
        }
    }
}

/// The token of an `Authorization: Bearer` header value.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The reviews of one request to `/metrics` whose `Authorization` header is `header`.
pub async fn check(access: &MetricsAccess, header: Option<&str>) -> Result<(), Denied> {
    let client = match access {
        MetricsAccess::Open => return Ok(()),
        MetricsAccess::Kubernetes(client) => client,
    };
    let token = bearer(header).ok_or(Denied::NoToken)?;
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: None,
        },
        ..Default::default()
    };
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let status = reviewed.status.unwrap_or_default();
    let user = match (status.authenticated, status.user) {
        (Some(true), Some(user)) => user,
        _ => return Err(Denied::Unauthenticated(status.error)),
    };
    let name = user.username.clone().unwrap_or_default();
    let access = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username,
            groups: user.groups,
            uid: user.uid,
            extra: user.extra,
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(METRICS_PATH.to_string()),
                verb: Some("get".to_string()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &access)
        .await?;
    if answer.status.is_some_and(|s| s.allowed) {
        Ok(())
    } else {
        Err(Denied::Forbidden { user: name })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bearer_header_with_a_token_names_a_token() {
        assert_eq!(bearer(Some("Bearer abc.def")), Some("abc.def"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic dXNlcjpwYXNz")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(Some("Bearer")), None);
        assert_eq!(bearer(None), None);
    }

    #[tokio::test]
    async fn an_open_port_asks_nothing_and_a_guarded_one_wants_a_token() {
        assert!(check(&MetricsAccess::Open, None).await.is_ok());
        // No request reaches the API server without a token: the mock answers nothing.
        let (mock, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = Client::new(mock, "default");
        let denied = check(&MetricsAccess::Kubernetes(client), Some("Basic x"))
            .await
            .expect_err("no bearer token");
        assert!(matches!(denied, Denied::NoToken));
        assert_eq!(denied.status(), 401);
    }
}
