// A handler that returns outputs, given to the consumer without the
// `PublishLayer` that publishes them.
use intake_core::memory::MemoryBroker;
use intake_core::publish::Output;
use intake_core::{Consumer, Payload, handler_fn};

async fn receipt(Payload(order): Payload) -> Output {
    Output::new("receipts", order)
}

fn main() {
    let broker = MemoryBroker::new();
    let (source, acker) = broker.consumer("orders", "billing").unwrap();
    let consumer = Consumer::builder().build(source, acker, handler_fn(receipt));
    drop(consumer);
}
