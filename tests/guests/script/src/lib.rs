//! Does what the message's `script` application property says for the
//! attempt it is on, so a test chooses each delivery's fate.
//!
//! `script` is a space-separated list of `ATTEMPT:ACTION` (or `*:ACTION`
//! for any other attempt); without a match the delivery is acked. Actions:
//! `ack`, `retry`, `drop`, `after=MS` (retry after MS milliseconds), `trap`
//! (panic), `spin` (loop forever), `hog` (allocate until refused), `print`
//! (write to stdout, then ack), `busy=MS` (compute for MS milliseconds, then
//! ack; reads the clock), `flood=BYTES` (write that much to stdout, then
//! ack), `env=NAME` (ack if the environment has NAME, else drop), `clock`
//! and `random` (read the wall clock or random bytes, then ack), `fresh`
//! (ack in a fresh instance, drop in one that served a delivery before),
//! `expect=KEY=TEXT` (ack if the property KEY, rendered as text, is TEXT,
//! else drop), `body=TEXT` (ack if the body is TEXT, else drop),
//! `fetch=URL` (GET URL: ack on a 2xx answer whose body is the delivery's
//! body, drop if the host denied the request, retry otherwise), `fields`
//! (create `wasi:http` header maps of 8 KiB each and keep them, until the
//! host refuses one: then trap), `open=N=HOST:PORT` (start N requests to
//! `http://HOST:PORT/slow` without waiting for any, then loop forever),
//! `shout=BYTES` (log that much at `error` in lines of 100 bytes, then
//! trap), `grow=MIB` (allocate and touch MIB MiB, then ack), `toil=MS`
//! (compute for MS milliseconds, then retry), `work=MS` (compute until it
//! has run for MS milliseconds, then ack: unlike `busy`, time the call
//! spent paused does not count, so it costs MS of CPU however it is
//! scheduled).
//!
//! Before its action a step may publish, with effects joined to it by commas
//! (`2:send=out,reply,retry`): `send=ADDRESS` (the delivery's body, with the
//! property `n` counting this delivery's outputs), `sends=N=ADDRESS` (N such
//! messages), `sendwith=KEY=ADDRESS` (as `send`, with the string property
//! KEY), `sendid=ID=ADDRESS` (as `send`, with the message-id ID), `reply`
//! (the body prefixed `re:`), `pad=BYTES` (later outputs
//! carry that many more bytes). Each must succeed or the delivery is dropped;
//! `fails=ERROR` instead requires the effect before it to have failed with
//! ERROR (`denied`, `too-many`, `too-large`, `no-reply-to`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use wharf_guest::http::{self, HttpError};
use wharf_guest::{Delivery, Message, Outcome, SendError, Value, log, outbox};

fn handle(d: Delivery) -> Outcome {
    let step = d
        .property_str("script")
        .and_then(|script| action_for(script, d.attempt))
        .unwrap_or("ack")
        .to_owned();
    log::info(&format!("attempt {}: {step}", d.attempt));
    let (effects, action) = split_effects(&step);
    if let Err(why) = publish(&d, &effects) {
        log::warn(&why);
        return Outcome::Drop;
    }
    act(&d, action)
}

/// A step's leading effects, and its action: only an effect's name takes
/// a comma after it, so an action's argument may hold commas.
fn split_effects(step: &str) -> (Vec<&str>, &str) {
    const EFFECTS: [&str; 7] = [
        "send=",
        "sends=",
        "sendwith=",
        "sendid=",
        "reply",
        "pad=",
        "fails=",
    ];
    let mut effects = Vec::new();
    let mut rest = step;
    while EFFECTS.iter().any(|e| rest.starts_with(e))
        && let Some((effect, after)) = rest.split_once(',')
    {
        effects.push(effect);
        rest = after;
    }
    (effects, rest)
}

/// Carries out a step's publishing effects in order.
fn publish(d: &Delivery, effects: &[&str]) -> Result<(), String> {
    let mut pad = 0;
    let mut sent = 0;
    // The result of the effect before, not yet checked.
    let mut unchecked: Option<(usize, Result<(), SendError>)> = None;
    for (i, effect) in effects.iter().enumerate() {
        if let Some(wanted) = effect.strip_prefix("fails=") {
            match unchecked.take() {
                Some((_, Err(e))) if error_name(&e) == wanted => continue,
                other => return Err(format!("wanted {wanted} before effect {i}, got {other:?}")),
            }
        }
        if let Some((j, result)) = unchecked.take() {
            result.map_err(|e| format!("effect {j}: {e:?}"))?;
        }
        let mut output = || {
            sent += 1;
            let mut body = d.body.clone();
            body.resize(body.len() + pad, b'.');
            Message::new(body).with_property("n", Value::Uint(sent))
        };
        let result = if let Some(address) = effect.strip_prefix("send=") {
            outbox::send(address, output())
        } else if let Some((n, address)) = effect
            .strip_prefix("sends=")
            .and_then(|rest| rest.split_once('='))
        {
            let n: usize = n.parse().map_err(|_| format!("bad count in {effect}"))?;
            (0..n).try_for_each(|_| outbox::send(address, output()))
        } else if let Some((key, address)) = effect
            .strip_prefix("sendwith=")
            .and_then(|rest| rest.split_once('='))
        {
            let message = output().with_property(key, Value::String("x".to_owned()));
            outbox::send(address, message)
        } else if let Some((id, address)) = effect
            .strip_prefix("sendid=")
            .and_then(|rest| rest.split_once('='))
        {
            outbox::send(address, output().with_message_id(id))
        } else if *effect == "reply" {
            let mut body = b"re:".to_vec();
            body.extend_from_slice(&d.body);
            outbox::reply(Message::new(body))
        } else if let Some(Ok(bytes)) = effect.strip_prefix("pad=").map(str::parse) {
            pad = bytes;
            Ok(())
        } else {
            return Err(format!("unknown effect {effect}"));
        };
        unchecked = Some((i, result));
    }
    match unchecked {
        Some((j, Err(e))) => Err(format!("effect {j}: {e:?}")),
        _ => Ok(()),
    }
}

fn error_name(error: &SendError) -> &'static str {
    match error {
        SendError::Denied => "denied",
        SendError::TooMany => "too-many",
        SendError::TooLarge => "too-large",
        SendError::NoReplyTo => "no-reply-to",
    }
}

fn act(d: &Delivery, action: &str) -> Outcome {
    match action {
        "retry" => Outcome::Retry,
        "drop" => Outcome::Drop,
        "trap" => panic!("fixture asked to trap on attempt {}", d.attempt),
        "spin" => spin(),
        "hog" => hog(),
        "fields" => fields(),
        "print" => {
            println!("hello from attempt {}", d.attempt);
            Outcome::Ack
        }
        "clock" => {
            std::hint::black_box(std::time::SystemTime::now());
            Outcome::Ack
        }
        "random" => {
            std::hint::black_box(std::collections::hash_map::RandomState::new());
            Outcome::Ack
        }
        "fresh" => {
            static SERVED: AtomicU32 = AtomicU32::new(0);
            if SERVED.fetch_add(1, Ordering::Relaxed) == 0 {
                Outcome::Ack
            } else {
                Outcome::Drop
            }
        }
        other => {
            if let Some(Ok(bytes)) = other.strip_prefix("flood=").map(str::parse::<usize>) {
                flood(bytes);
            }
            if let Some((key, wanted)) = other
                .strip_prefix("expect=")
                .and_then(|e| e.split_once('='))
            {
                let rendered = d.property(key).map(render);
                return match rendered {
                    Some(seen) if seen == wanted => Outcome::Ack,
                    seen => {
                        log::warn(&format!("property {key} is {seen:?}"));
                        Outcome::Drop
                    }
                };
            }
            if let Some((n, authority)) = other
                .strip_prefix("open=")
                .and_then(|spec| spec.split_once('='))
                .and_then(|(n, authority)| Some((n.parse().ok()?, authority)))
            {
                return open(n, authority);
            }
            if let Some(Ok(bytes)) = other.strip_prefix("shout=").map(str::parse::<usize>) {
                shout(bytes);
            }
            if let Some(url) = other.strip_prefix("fetch=") {
                return fetch(d, url);
            }
            if let Some(wanted) = other.strip_prefix("body=") {
                return if d.body_str() == Some(wanted) {
                    Outcome::Ack
                } else {
                    log::warn(&format!("body is {:?}", d.body_str()));
                    Outcome::Drop
                };
            }
            if let Some(name) = other.strip_prefix("env=") {
                return match std::env::var(name) {
                    Ok(_) => Outcome::Ack,
                    Err(_) => Outcome::Drop,
                };
            }
            if let Some(Ok(ms)) = other.strip_prefix("after=").map(str::parse) {
                return Outcome::retry_after(Duration::from_millis(ms));
            }
            if let Some(Ok(mib)) = other.strip_prefix("grow=").map(str::parse::<usize>) {
                std::hint::black_box(vec![1u8; mib << 20]);
            }
            if let Some(Ok(ms)) = other.strip_prefix("toil=").map(str::parse) {
                busy(Duration::from_millis(ms));
                return Outcome::Retry;
            }
            if let Some(Ok(ms)) = other.strip_prefix("busy=").map(str::parse) {
                busy(Duration::from_millis(ms));
            }
            if let Some(Ok(ms)) = other.strip_prefix("work=").map(str::parse) {
                work(Duration::from_millis(ms));
            }
            Outcome::Ack
        }
    }
}

fn fetch(d: &Delivery, url: &str) -> Outcome {
    match http::get(url) {
        Ok(response) if (200..300).contains(&response.status) && response.body == d.body => {
            Outcome::Ack
        }
        Ok(response) => {
            log::warn(&format!("{url}: {} {:?}", response.status, response.text()));
            Outcome::Retry
        }
        Err(HttpError::Denied) => Outcome::Drop,
        Err(e) => {
            log::warn(&format!("{url}: {e}"));
            Outcome::Retry
        }
    }
}

/// A property value as text: the text of strings and of everything the host
/// renders (lists, maps, uuids...), numbers in decimal.
fn render(value: &Value) -> String {
    match value {
        Value::String(s) | Value::Other(s) => s.clone(),
        Value::Int(n) | Value::Timestamp(n) => n.to_string(),
        Value::Uint(n) => n.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Boolean(b) => b.to_string(),
        Value::Bytes(bytes) => format!("{bytes:?}"),
        Value::Null => "null".to_owned(),
    }
}

fn action_for(script: &str, attempt: u32) -> Option<&str> {
    let mut fallback = None;
    for step in script.split_whitespace() {
        let (when, action) = step.split_once(':')?;
        if when == "*" {
            fallback = Some(action);
        } else if when.parse() == Ok(attempt) {
            return Some(action);
        }
    }
    fallback
}

fn spin() -> Outcome {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

fn busy(time: Duration) {
    let start = std::time::Instant::now();
    while start.elapsed() < time {
        std::hint::spin_loop();
    }
}

/// Spins until it has run for `time`: a gap between two clock reads of
/// a millisecond or more is a pause (the host holding the call, or the
/// thread descheduled), not running.
fn work(time: Duration) {
    const PAUSED: Duration = Duration::from_millis(1);
    let mut ran = Duration::ZERO;
    let mut last = std::time::Instant::now();
    while ran < time {
        std::hint::spin_loop();
        let now = std::time::Instant::now();
        let gap = now - last;
        if gap < PAUSED {
            ran += gap;
        }
        last = now;
    }
}

fn flood(bytes: usize) {
    let line = "x".repeat(99);
    for _ in 0..bytes / 100 {
        println!("{line}");
    }
}

fn hog() -> Outcome {
    let mut chunks = Vec::new();
    loop {
        chunks.push(std::hint::black_box(vec![1u8; 1 << 20]));
    }
}

fn open(n: usize, authority: &str) -> Outcome {
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{Fields, OutgoingRequest, Scheme};
    let mut held = Vec::new();
    for _ in 0..n {
        let request = OutgoingRequest::new(Fields::new());
        let _ = request.set_scheme(Some(&Scheme::Http));
        let _ = request.set_authority(Some(authority));
        let _ = request.set_path_with_query(Some("/slow"));
        if let Ok(response) = outgoing_handler::handle(request, None) {
            held.push(response);
        }
    }
    spin()
}

fn shout(bytes: usize) -> ! {
    let line = format!("shout {}", "!".repeat(94));
    for _ in 0..bytes / 100 {
        log::error(&line);
    }
    panic!("shouted {bytes} bytes")
}

fn fields() -> Outcome {
    use wasip2::http::types::Fields;
    let value = vec![b'v'; 1024];
    let mut held = Vec::new();
    loop {
        let fields = Fields::new();
        for i in 0..8 {
            if let Err(e) = fields.append(&format!("x-filler-{i}"), &value) {
                panic!("header {i} of map {} refused: {e:?}", held.len());
            }
        }
        held.push(fields);
    }
}

wharf_guest::handler!(handle);
