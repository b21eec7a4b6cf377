//! Which traces are recorded: the OpenTelemetry samplers, by the names
//! `OTEL_TRACES_SAMPLER` gives them, decided on a span's trace id and its
//! parent's sampled flag so that every process in a trace decides the same.

use std::fmt;

/// The trace flag that says a trace is recorded.
pub const SAMPLED: u8 = 0x01;

/// A sampler: what becomes of a trace that starts here, and whether a
/// parent's decision is followed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// The decision for a trace that starts here (and, when not
    /// `parent_based`, for every trace).
    pub root: Decision,
    /// Whether a span with a parent follows the parent's sampled flag.
    pub parent_based: bool,
}

/// How a sampler decides a trace without a parent to follow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    /// Every trace is recorded.
    AlwaysOn,
    /// No trace is recorded.
    AlwaysOff,
    /// This share of traces (0 to 1), chosen by trace id.
    Ratio(f64),
}

impl Default for Sampler {
    /// `parentbased_always_on`, the OpenTelemetry default.
    fn default() -> Sampler {
        Sampler {
            root: Decision::AlwaysOn,
            parent_based: true,
        }
    }
}

impl Sampler {
    /// The sampler `name` (an `OTEL_TRACES_SAMPLER` value) with `arg` (an
    /// `OTEL_TRACES_SAMPLER_ARG` value, the ratio of the `traceidratio`
    /// samplers, 1.0 when absent).
    pub fn parse(name: &str, arg: Option<&str>) -> Result<Sampler, String> {
        let ratio = || -> Result<Decision, String> {
            let Some(arg) = arg else {
                return Ok(Decision::Ratio(1.0));
            };
            match arg.trim().parse::<f64>() {
                Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(Decision::Ratio(ratio)),
                _ => Err(format!(
                    "the sampler ratio `{arg}` is not a number from 0 to 1"
                )),
            }
        };
        let (root, parent_based) = match name.trim() {
            "always_on" => (Decision::AlwaysOn, false),
            "always_off" => (Decision::AlwaysOff, false),
            "traceidratio" => (ratio()?, false),
            "parentbased_always_on" => (Decision::AlwaysOn, true),
            "parentbased_always_off" => (Decision::AlwaysOff, true),
            "parentbased_traceidratio" => (ratio()?, true),
            other => {
                return Err(format!(
                    "`{other}` is not a sampler wharf knows: use always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
                ));
            }
        };
        Ok(Sampler { root, parent_based })
    }

    /// Whether a span of trace `trace_id` is recorded, below a parent
    /// whose sampled flag is `parent_sampled` (`None` without a parent).
    pub fn sampled(&self, trace_id: &[u8; 16], parent_sampled: Option<bool>) -> bool {
        if self.parent_based
            && let Some(parent_sampled) = parent_sampled
        {
            return parent_sampled;
        }
        match self.root {
            Decision::AlwaysOn => true,
            Decision::AlwaysOff => false,
            Decision::Ratio(ratio) => {
                // The trace id's low 8 bytes, as the other SDKs read them,
                // so a trace is kept or not the same way everywhere.
                let mut low = [0; 8];
                low.copy_from_slice(&trace_id[8..]);
                let value = u64::from_be_bytes(low) >> 1;
                (value as f64) < ratio * (1u64 << 63) as f64
            }
        }
    }
}

impl fmt::Display for Sampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parent = if self.parent_based {
            "parentbased_"
        } else {
            ""
        };
        match self.root {
            Decision::AlwaysOn => write!(f, "{parent}always_on"),
            Decision::AlwaysOff => write!(f, "{parent}always_off"),
            Decision::Ratio(ratio) => write!(f, "{parent}traceidratio {ratio}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trace ids spread as random ones are (SplitMix64).
    fn trace_ids() -> impl Iterator<Item = [u8; 16]> {
        let mut state = 0x1234_5678_u64;
        std::iter::repeat_with(move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            let mut id = [0; 16];
            id[8..].copy_from_slice(&(z ^ (z >> 31)).to_be_bytes());
            id
        })
    }

    #[test]
    fn names_and_ratios_parse_as_the_specification_gives_them() {
        assert_eq!(
            Sampler::parse("parentbased_always_on", None),
            Ok(Sampler::default())
        );
        assert_eq!(
            Sampler::parse("traceidratio", Some("0.25")),
            Ok(Sampler {
                root: Decision::Ratio(0.25),
                parent_based: false
            })
        );
        assert!(Sampler::parse("traceidratio", Some("2")).is_err());
        assert!(
            Sampler::parse("sometimes", None)
                .expect_err("refused")
                .contains("sometimes")
        );
    }

    #[test]
    fn a_parent_based_sampler_follows_the_parent_and_decides_roots_itself() {
        let sampler = Sampler::parse("parentbased_always_off", None).expect("a sampler");
        assert!(sampler.sampled(&[7; 16], Some(true)));
        assert!(!sampler.sampled(&[7; 16], Some(false)));
        assert!(!sampler.sampled(&[7; 16], None));
        let always = Sampler::parse("always_on", None).expect("a sampler");
        assert!(always.sampled(&[7; 16], Some(false)));
    }

    #[test]
    fn a_ratio_keeps_about_that_share_of_traces_and_the_same_trace_every_time() {
        let sampler = Sampler::parse("traceidratio", Some("0.25")).expect("a sampler");
        let kept = trace_ids()
            .take(4000)
            .filter(|id| sampler.sampled(id, None))
            .count();
        assert!((800..1200).contains(&kept), "{kept} of 4000 kept");
        let id = [0xab; 16];
        assert_eq!(sampler.sampled(&id, None), sampler.sampled(&id, None));
        let none = Sampler::parse("traceidratio", Some("0")).expect("a sampler");
        assert!(!none.sampled(&[0; 16], None));
    }
}
