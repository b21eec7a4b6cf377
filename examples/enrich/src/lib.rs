//! Enriches orders: reads an order (`{"sku": "A-1", "qty": 2}`), asks a
//! price service for the SKU's unit price (`GET $PRICES_URL/<sku>`, the
//! price as text), publishes the order with `unit_price` and `total` to
//! `ENRICHED_ADDRESS`, and acks. The enriched order is published only
//! because the handler acks; an unknown SKU is dropped, a price service
//! that fails is retried a second later.
//!
//! The HTTP call is not part of the settlement: a retried order asks for
//! its price again. Its mount grants the service, the address and the
//! environment that names them:
//!
//! ```toml
//! [tenant.mount.grants]
//! http = ["http://127.0.0.1:8091"]
//! send = ["demo.orders.enriched"]
//! env = { PRICES_URL = "http://127.0.0.1:8091", ENRICHED_ADDRESS = "demo.orders.enriched" }
//! ```

use std::time::Duration;

use serde_json::{Value, json};
use wharf_guest::{Delivery, Message, Outcome, http, log, outbox};

fn handle(d: Delivery) -> Outcome {
    let (Ok(prices), Ok(enriched)) = (
        std::env::var("PRICES_URL"),
        std::env::var("ENRICHED_ADDRESS"),
    ) else {
        log::error("grant PRICES_URL and ENRICHED_ADDRESS in the mount's `grants.env`");
        return Outcome::Retry;
    };
    let Ok(order) = serde_json::from_slice::<Value>(&d.body) else {
        log::warn("not a JSON order");
        return Outcome::Drop;
    };
    let (Some(sku), Some(qty)) = (order["sku"].as_str(), order["qty"].as_u64()) else {
        log::warn("an order needs `sku` and `qty`");
        return Outcome::Drop;
    };
    let price = match http::get(&format!("{prices}/{sku}")) {
        Ok(answer) if answer.status == 200 => answer.text().and_then(|t| t.trim().parse::<f64>().ok()),
        Ok(answer) if answer.status == 404 => {
            log::warn(&format!("unknown SKU {sku}"));
            return Outcome::Drop;
        }
        Ok(answer) => {
            log::warn(&format!("the price service answered {}", answer.status));
            return Outcome::retry_after(Duration::from_secs(1));
        }
        Err(e) => {
            log::warn(&format!("the price service: {e}"));
            return Outcome::retry_after(Duration::from_secs(1));
        }
    };
    let Some(unit_price) = price else {
        log::warn(&format!("the price of {sku} is not a number"));
        return Outcome::Drop;
    };
    let mut order = order;
    order["unit_price"] = json!(unit_price);
    order["total"] = json!(unit_price * qty as f64);
    let message = Message::new(order.to_string()).with_content_type("application/json");
    match outbox::send(&enriched, message) {
        Ok(()) => Outcome::Ack,
        Err(e) => {
            log::error(&format!("cannot publish to {enriched}: {e:?}"));
            Outcome::Retry
        }
    }
}

wharf_guest::handler!(handle);
