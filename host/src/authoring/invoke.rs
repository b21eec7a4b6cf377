//! `wharf invoke`: one delivery through a component in the real sandbox,
//! without a broker, to try a handler while writing it.

use std::path::Path;
use std::sync::Arc;

use crate::sandbox::{
    CallLimits, Delivery, Failure, Instances, LogTags, Outcome, Outgoing, Owners, Property,
    Sandbox, TenantShare, Value,
};
use wharf_core::config::InstancePolicy;
use wharf_core::config::{LogLevel, Mount, TenantBudget};
use wharf_core::grants::Grants;
use wharf_core::message::Fields;

/// What the made-up delivery carries.
#[derive(Debug, Clone, Default)]
pub struct InvokeInput {
    /// The message body.
    pub body: Vec<u8>,
    /// String application properties.
    pub properties: Vec<(String, String)>,
    /// The attempt number the handler sees.
    pub attempt: u32,
    /// The delivery's `reply-to`.
    pub reply_to: Option<String>,
    /// Its other AMQP header and properties fields.
    pub fields: Fields,
    /// String message annotations.
    pub annotations: Vec<(String, String)>,
    /// What the handler may use.
    pub grants: Grants,
}

impl InvokeInput {
    /// The delivery a handler sees for this input, on a made-up address,
    /// tenant and mount all called `invoke`.
    pub fn delivery(&self) -> Delivery {
        Delivery {
            body: self.body.clone(),
            content_type: None,
            subject: None,
            message_id: Some("invoke-1".to_owned()),
            correlation_id: None,
            reply_to: self.reply_to.clone(),
            to: self.fields.to.clone(),
            user_id: self.fields.user_id.clone(),
            group_id: self.fields.group_id.clone(),
            group_sequence: self.fields.group_sequence,
            reply_to_group_id: self.fields.reply_to_group_id.clone(),
            creation_time: self.fields.creation_time,
            absolute_expiry_time: self.fields.absolute_expiry_time,
            priority: self.fields.priority.unwrap_or(Fields::DEFAULT_PRIORITY),
            durable: self.fields.durable,
            first_acquirer: self.fields.first_acquirer,
            annotations: self
                .annotations
                .iter()
                .map(|(key, value)| Property {
                    key: key.clone(),
                    value: Value::String(value.clone()),
                })
                .collect(),
            properties: self
                .properties
                .iter()
                .map(|(key, value)| Property {
                    key: key.clone(),
                    value: Value::String(value.clone()),
                })
                .collect(),
            address: "invoke".to_owned(),
            tenant: "invoke".to_owned(),
            mount: "invoke".to_owned(),
            attempt: self.attempt.max(1),
            presettled: false,
        }
    }
}

/// Loads `module` and runs one delivery through it with the default mount
/// limits; the load error, or the handler's outcome or failure and the
/// messages it would publish with an `ack`.
pub async fn invoke(
    module: &Path,
    input: InvokeInput,
) -> anyhow::Result<(Result<Outcome, Failure>, Vec<Outgoing>)> {
    let sandbox = Sandbox::new(1)?;
    let module = sandbox.load(module)?;
    let delivery = input.delivery();
    let limits = CallLimits {
        timeout: Mount::DEFAULT_TIMEOUT,
        memory: Mount::DEFAULT_MEMORY,
    };
    let tags = Arc::new(LogTags {
        tenant: "invoke".into(),
        mount: "invoke".into(),
    });
    let instances = Arc::new(Instances::new(
        module,
        limits,
        InstancePolicy::PerDelivery,
        input.grants,
        tags,
        Owners::default(),
        TenantShare::new(&TenantBudget {
            log_level: LogLevel::Error,
            ..TenantBudget::default()
        }),
        sandbox.slots().clone(),
    ));
    // No broker: addresses are read as every broker wharf knows would.
    let call = instances
        .reserve()
        .await
        .call(&delivery, wharf_core::brokers::BrokerKind::Other)
        .await;
    Ok((call.result, call.outputs))
}
