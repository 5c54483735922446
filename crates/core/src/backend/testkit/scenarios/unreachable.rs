//! An unreachable broker: a typed error within a bounded wait.

use crate::backend::testkit::Backend;
use crate::backend::testkit::harness::unique_group;

/// A broker that does not answer is a typed error within a bounded wait,
/// never a hang, and neither its text nor its `Debug` holds the password
/// the address carried. Skipped where the backend has no address (the
/// memory broker).
pub async fn an_unreachable_broker_is_an_error_without_its_password<B: Backend>(backend: &B) {
    const PASSWORD: &str = "s3cret-conformance-password";
    let group = unique_group("unreachable");
    let attempt = tokio::time::timeout(
        crate::backend::testkit::harness::PATIENCE,
        backend.connect_unreachable("intake-unreachable", &group, PASSWORD),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{}: connecting to a broker that does not answer hung",
            backend.name()
        )
    });
    let Some(result) = attempt else {
        eprintln!("skipped: {} has no broker address", backend.name());
        return;
    };
    let error = match result {
        Ok(_) => panic!(
            "{}: a source was built although no broker answers",
            backend.name()
        ),
        Err(error) => error,
    };
    let mut chain = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        chain.push_str(": ");
        chain.push_str(&inner.to_string());
        cause = inner.source();
    }
    let debug = format!("{error:?}");
    assert!(
        !chain.is_empty(),
        "{}: the error says nothing",
        backend.name()
    );
    assert!(
        !chain.contains(PASSWORD) && !debug.contains(PASSWORD),
        "{}: the password is in the error: {chain} / {debug}",
        backend.name()
    );
}
