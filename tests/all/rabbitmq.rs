//! The second broker: RabbitMQ 3.10 with its AMQP 1.0 plugin.
