//! One admission review, decided with no I/O: a FabricTest create or spec change is refused
//! with every problem `validate()` finds (with a suite larger than the GPUs it selects,
//! `profiles::validate`), and allowed with `warnings()` otherwise.

use gpufabric_api::FabricTestSpec;
use gpufabric_api::validate::warnings;
use gpufabric_health::profiles::validate;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};

/// The path the API server posts FabricTest reviews to.
pub const FABRICTEST_PATH: &str = "/validate/fabrictests";

/// The spec of an admitted object (absent `spec` is the all-defaults spec).
fn spec_of(obj: &DynamicObject) -> Result<FabricTestSpec, serde_json::Error> {
    match obj.data.get("spec") {
        Some(spec) => serde_json::from_value(spec.clone()),
        None => serde_json::from_value(serde_json::json!({})),
    }
}

/// The answer to one request. Only a create, or an update that changes the spec, is
/// judged: an update of metadata alone (a finalizer removed while the test is deleted, an
/// annotation) always passes, so a test stored before this check existed can still be
/// deleted and triggered.
pub fn decide(req: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let response = AdmissionResponse::from(req);
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return response;
    }
    let Some(obj) = &req.object else {
        return response.deny("the review carries no object to check");
    };
    let spec = match spec_of(obj) {
        Ok(spec) => spec,
        Err(e) => return response.deny(format!("spec does not parse as a FabricTest: {e}")),
    };
    if req.operation == Operation::Update
        && let Some(old) = &req.old_object
        && spec_of(old).is_ok_and(|old| old == spec)
    {
        return response;
    }
    if let Err(e) = validate(&spec) {
        return response.deny(e.to_string());
    }
    let said = warnings(&spec);
    let mut response = response;
    if !said.is_empty() {
        response.warnings = Some(said);
    }
    response
}

/// Why a request body is not an admission review.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an AdmissionReview: {0}")]
    Parse(#[source] serde_json::Error),
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("the answer does not serialise: {0}")]
    Encode(#[source] serde_json::Error),
}

/// A review body in, the review answer out (JSON both).
pub fn answer(body: &[u8]) -> Result<Vec<u8>, ReviewError> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(ReviewError::Parse)?;
    let req: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| ReviewError::NoRequest)?;
    let response = decide(&req);
    serde_json::to_vec(&response.into_review()).map_err(ReviewError::Encode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn review(operation: &str, spec: Value, old_spec: Option<Value>) -> Vec<u8> {
        let object = |spec: Value| {
            json!({
                "apiVersion": "gpufabric.io/v1alpha1",
                "kind": "FabricTest",
                "metadata": {"name": "t"},
                "spec": spec,
            })
        };
        let mut request = json!({
            "uid": "0b6f2c9e-1",
            "kind": {"group": "gpufabric.io", "version": "v1alpha1", "kind": "FabricTest"},
            "resource": {"group": "gpufabric.io", "version": "v1alpha1", "resource": "fabrictests"},
            "name": "t",
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": object(spec),
        });
        if let Some(old) = old_spec {
            request["oldObject"] = object(old);
        }
        let body = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request,
        });
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// The response part of the answer to `body`.
    fn respond(body: &[u8]) -> Value {
        let out = answer(body).unwrap_or_else(|e| panic!("no answer: {e}"));
        let v: Value = serde_json::from_slice(&out).unwrap_or(Value::Null);
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(v["kind"], "AdmissionReview");
        assert_eq!(v["response"]["uid"], "0b6f2c9e-1");
        v["response"].clone()
    }

    #[test]
    fn a_schedule_that_never_fires_is_refused_with_its_reason() {
        let r = respond(&review("CREATE", json!({"schedule": "0 0 31 2 *"}), None));
        assert_eq!(r["allowed"], false);
        let msg = r["status"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("schedule \"0 0 31 2 *\" never fires"), "{msg}");
    }

    #[test]
    fn an_unknown_time_zone_and_a_bad_selector_are_refused_together() {
        let r = respond(&review(
            "CREATE",
            json!({"schedule": "0 2 * * *", "timeZone": "Mars/Olympus",
                   "nodeSelector": {"bad key": "x"}}),
            None,
        ));
        assert_eq!(r["allowed"], false);
        let msg = r["status"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("timeZone: timeZone \"Mars/Olympus\""), "{msg}");
        assert!(
            msg.contains("\"bad key\" is not a valid label key"),
            "{msg}"
        );
    }

    #[test]
    fn a_spec_that_does_not_parse_is_refused_not_dropped() {
        let r = respond(&review("CREATE", json!({"suspend": "often"}), None));
        assert_eq!(r["allowed"], false);
        let msg = r["status"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("spec does not parse as a FabricTest"), "{msg}");
    }

    #[test]
    fn a_good_spec_is_allowed_and_a_slow_one_with_a_warning() {
        let r = respond(&review("CREATE", json!({"schedule": "@daily"}), None));
        assert_eq!(r["allowed"], true);
        assert!(r.get("warnings").is_none_or(Value::is_null), "{r}");

        let r = respond(&review(
            "CREATE",
            json!({"agent": {"timeoutSeconds": 20}}),
            None,
        ));
        assert_eq!(r["allowed"], true);
        let w = r["warnings"][0].as_str().unwrap_or_default();
        assert!(w.contains("more than agent.timeoutSeconds (20 s)"), "{r}");
    }

    #[test]
    fn an_update_that_keeps_the_spec_passes_even_when_the_spec_is_bad() {
        let bad = json!({"schedule": "0 0 30 2 *"});
        let r = respond(&review("UPDATE", bad.clone(), Some(bad.clone())));
        assert_eq!(r["allowed"], true);
        let r = respond(&review("UPDATE", bad, Some(json!({"schedule": "@daily"}))));
        assert_eq!(r["allowed"], false);
    }

    #[test]
    fn a_suite_larger_than_the_selected_gpus_is_refused_naming_the_field() {
        let r = respond(&review(
            "CREATE",
            json!({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                   "suite": {"ncclSweep": {"maxBytes": 1u64 << 40}}}),
            None,
        ));
        assert_eq!(r["allowed"], false);
        let msg = r["status"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("suite.ncclSweep.maxBytes: needs 3.0 TiB on each GPU")
                && msg.contains("H100 80GB HBM3"),
            "{msg}"
        );
    }

    #[test]
    fn a_delete_is_never_judged() {
        let r = respond(&review("DELETE", json!({"schedule": "0 0 30 2 *"}), None));
        assert_eq!(r["allowed"], true);
    }

    #[test]
    fn a_body_that_is_not_a_review_is_an_error() {
        let no_request = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
        assert!(matches!(answer(no_request), Err(ReviewError::NoRequest)));
        assert!(matches!(answer(b"nope"), Err(ReviewError::Parse(_))));
    }
}
