//! Creating topics: the dead-letter sink, the parking and the dead-letter
//! store each create topics of their own on first use, the same way.

use std::sync::{Arc, Mutex, PoisonError};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::settings::KafkaSettings;

/// An admin client made on first use: most runs create no topic, and an
/// admin client is a connection of its own.
pub(crate) struct LazyAdmin {
    settings: KafkaSettings,
    client: Mutex<Option<Arc<AdminClient<DefaultClientContext>>>>,
}

impl LazyAdmin {
    pub(crate) fn new(settings: KafkaSettings) -> Self {
        Self {
            settings,
            client: Mutex::new(None),
        }
    }

    /// The admin client, made now if it was not before.
    pub(crate) fn client(&self) -> Result<Arc<AdminClient<DefaultClientContext>>, KafkaError> {
        let mut client = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = client.as_ref() {
            return Ok(Arc::clone(client));
        }
        let created = Arc::new(self.settings.client_config().create()?);
        *client = Some(Arc::clone(&created));
        Ok(created)
    }
}

/// Creates `topic`. A topic that exists already (made meanwhile by another
/// instance) is no error; returns whether this call created it.
pub(crate) async fn create_topic(
    admin: &AdminClient<DefaultClientContext>,
    topic: &NewTopic<'_>,
    options: &AdminOptions,
) -> Result<bool, KafkaError> {
    let mut created = false;
    for result in admin
        .create_topics(std::slice::from_ref(topic), options)
        .await?
    {
        match result {
            Ok(_) => created = true,
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(KafkaError::AdminOp(code)),
        }
    }
    Ok(created)
}
