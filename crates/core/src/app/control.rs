//! [`AppControl`]: each route's [`ConsumerControl`], by route name.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::consumer::ConsumerControl;

/// The [`ConsumerControl`] of each route of an [`App`](super::App), by
/// route name: pause and resume a route, or one of its partitions, while
/// the app runs (the console's `POST .../routes/{route}/pause` goes through
/// it). From [`App::control`](super::App::control); cheap to clone, and
/// routes added to the app later are in it too.
///
/// ```
/// use intake_core::app::App;
/// use intake_core::consumer::Consumer;
/// use intake_core::memory::MemoryBroker;
/// use intake_core::{HandlerError, Message};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = MemoryBroker::new();
/// broker.create_topic("orders", 2)?;
/// let (source, acker) = broker.consumer("orders", "billing")?;
/// let handler = tower::service_fn(|_message: Message| async { Ok::<_, HandlerError>(()) });
/// let app = App::new().route("orders", Consumer::builder().build(source, acker, handler)?);
/// let control = app.control();
/// control.route("orders").expect("a route").pause_partition("orders", 0);
/// assert_eq!(control.routes(), ["orders"]);
/// # drop(app);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct AppControl {
    routes: Arc<Mutex<BTreeMap<String, ConsumerControl>>>,
}

impl AppControl {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ConsumerControl>> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The control of route `name`, if the app has it.
    pub fn route(&self, name: &str) -> Option<ConsumerControl> {
        self.lock().get(name).cloned()
    }

    /// The routes' names, sorted.
    pub fn routes(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    pub(super) fn insert(&self, name: String, control: ConsumerControl) {
        self.lock().insert(name, control);
    }
}
