//! One channel's session: opening it (connect, declare, check the queue),
//! starting its consumer, and closing it.

use lapin::Channel;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{FieldTable, ShortString};
use tokio::time::Instant;

use crate::connection::open_within;
use crate::error::{Error, Operation, classify};
use crate::topology::{Exchange, short};
use crate::url::AmqpUrl;

use super::{Consuming, Session, Settings, Target};

/// [`open_session`] within the connect timeout: a broker that accepts the
/// connection and then stalls (a node in trouble, a network that drops
/// packets after the handshake) must not hold a reconnect for good.
pub(super) async fn open_session_within(
    settings: &Settings,
    epoch: u32,
    quarantine: Option<u64>,
    prefetch: Option<u16>,
) -> Result<Session, Error> {
    let timeout = settings.connect_timeout;
    tokio::time::timeout(timeout, open_session(settings, epoch, quarantine, prefetch))
        .await
        .unwrap_or_else(|_elapsed| {
            Err(Error::Unreachable {
                endpoint: settings.url.endpoint().to_owned(),
                source: format!(
                    "the broker did not finish opening the consumer's channel within {timeout:?}"
                )
                .into(),
            })
        })
}

/// Connects, declares, and starts consuming with `prefetch`, or with a
/// prefetch of 1 for the first `quarantine` deliveries; with no `prefetch`,
/// leaves the consumer to the first [`Source::next`] (see [`Consuming`]).
async fn open_session(
    settings: &Settings,
    epoch: u32,
    quarantine: Option<u64>,
    prefetch: Option<u16>,
) -> Result<Session, Error> {
    let url = &settings.url;
    fn fail<'a>(url: &'a AmqpUrl, operation: Operation<'a>) -> impl Fn(lapin::Error) -> Error + 'a {
        move |error| classify(error, url.endpoint(), url.vhost(), operation)
    }
    let connection = open_within(
        url,
        settings.connection_name.as_deref(),
        &settings.tls,
        settings.connect_timeout,
    )
    .await?;
    // Listen from the start: lapin queues events only for live listeners.
    let events = Box::pin(connection.events_listener());
    let channel = connection
        .create_channel()
        .await
        .map_err(fail(url, Operation::Other))?;
    settings.topology.declare_on(&channel, url).await?;
    let queue = match &settings.target {
        Target::Queue(queue) => {
            let declared = settings
                .topology
                .queues()
                .iter()
                .any(|declared| declared.name() == queue);
            if !declared {
                channel
                    .queue_declare(
                        short(queue),
                        QueueDeclareOptions {
                            passive: true,
                            ..QueueDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .map_err(fail(url, Operation::UseQueue(queue)))?;
            }
            queue.clone()
        }
        Target::Broadcast { exchange } => {
            Exchange::fanout(exchange.as_str())
                .declare_on(&channel, url)
                .await?;
            let own = channel
                .queue_declare(
                    short(""),
                    QueueDeclareOptions {
                        exclusive: true,
                        auto_delete: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(fail(url, Operation::Declare("the broadcast queue")))?;
            let own = own.name().as_str().to_owned();
            channel
                .queue_bind(
                    short(&own),
                    short(exchange),
                    short(""),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(fail(url, Operation::Declare("the broadcast binding")))?;
            own
        }
    };
    let (consumer, prefetch) = match prefetch {
        Some(prefetch) => {
            let prefetch = if quarantine.is_some() { 1 } else { prefetch };
            let consumer = start_consuming(channel.clone(), short(&queue), prefetch)
                .await
                .map_err(fail(url, Operation::UseQueue(&queue)))?;
            (Consuming::Started(consumer), prefetch)
        }
        None => (Consuming::NotStarted, 0),
    };
    Ok(Session {
        epoch,
        connection,
        channel,
        consumer,
        events,
        queue,
        last_tag: 0,
        quarantine,
        prefetch,
        opened_at: Instant::now(),
        delivered: false,
    })
}

/// Sets the channel's prefetch for the consumer started next and starts it.
/// Owns what it uses, so that [`Consuming::Starting`] can keep it.
pub(super) async fn start_consuming(
    channel: Channel,
    queue: ShortString,
    prefetch: u16,
) -> Result<lapin::Consumer, lapin::Error> {
    channel
        .basic_qos(prefetch, BasicQosOptions { global: false })
        .await?;
    channel
        .basic_consume(
            queue,
            short(""),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
}

impl Session {
    /// Records a delivery read from the channel.
    pub(super) fn took(&mut self, tag: u64) {
        self.last_tag = tag;
        self.delivered = true;
        if let Some(left) = &mut self.quarantine {
            *left = left.saturating_sub(1);
        }
    }
}

/// Whether lapin closed the connection because it could not parse a frame
/// from the broker (a short string that is not UTF-8, among others).
pub(super) fn is_unparsable(error: &lapin::Error) -> bool {
    matches!(error.kind(), lapin::ErrorKind::ParsingError(_))
}
/// Cancels the consumer, hands back what it holds, closes channel and
/// connection.
pub(super) async fn close_session(session: Session, url: &AmqpUrl) -> Result<(), Error> {
    let fail = |error: lapin::Error| classify(error, url.endpoint(), url.vhost(), Operation::Other);
    let Session {
        channel,
        connection,
        consumer,
        ..
    } = session;
    if !channel.status().connected() {
        return Ok(());
    }
    // A consumer still starting goes with the channel.
    if let Consuming::Started(consumer) = consumer {
        channel
            .basic_cancel(consumer.tag(), BasicCancelOptions::default())
            .await
            .map_err(fail)?;
    }
    // Tag 0 with `multiple` covers every outstanding delivery.
    channel
        .basic_nack(
            0,
            BasicNackOptions {
                multiple: true,
                requeue: true,
            },
        )
        .await
        .map_err(fail)?;
    channel
        .close(200, short("intake consumer shut down"))
        .await
        .map_err(fail)?;
    connection
        .close(200, short("intake consumer shut down"))
        .await
        .map_err(fail)
}
