// The same handler given to an app's route: the route's own bound says
// what `build`'s says (name `PublishLayer`), never a bare type mismatch.
use intake_core::app::App;
use intake_core::memory::MemoryBroker;
use intake_core::publish::Output;
use intake_core::{Consumer, Payload, handler_fn};

async fn receipt(Payload(order): Payload) -> Output {
    Output::new("receipts", order)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = MemoryBroker::new();
    let (source, acker) = broker.consumer("orders", "billing")?;
    let app = App::new().route(
        "billing",
        Consumer::builder().build(source, acker, handler_fn(receipt))?,
    );
    drop(app);
    Ok(())
}
