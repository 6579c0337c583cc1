//! The registration point of each side: `sources/mod.rs` and `sinks/mod.rs`
//! name every connector once, with its config section, its Cargo feature
//! and its config type, through [`connectors!`](crate::connectors). That one
//! line declares the connector's module (compiled only with its feature),
//! its section in the runner's config file, and its entry in the list that
//! `source-runner` and `sink-runner` build from.

use tributary_operations::config::ConfigError;

/// A config section named `section` that this build does not have or
/// nobody knows: the error says which (and which feature builds it in).
pub fn unknown_section<E: serde::de::Error>(section: &str, side: &str, all: &[(&str, &str)]) -> E {
    let known: Vec<String> = all.iter().map(|(name, _)| format!("[{name}]")).collect();
    match all.iter().find(|(name, _)| *name == section) {
        Some((_, feature)) => E::custom(format!(
            "`{section}`: this build has no {section} {side} (it was built without the Cargo feature {feature})"
        )),
        None => E::custom(format!(
            "unknown field `{section}`: not a setting of this runner, nor a {side} section ({})",
            known.join(", ")
        )),
    }
}

/// The one section of a side that a runner's config file sets: `found` are
/// the configured sections by name; `all` every section known.
pub fn exactly_one<'a, T: ?Sized>(
    found: Vec<(&'static str, &'a T)>,
    side: &str,
    all: &[(&str, &str)],
    conflict: &str,
) -> Result<(&'static str, &'a T), ConfigError> {
    let names: Vec<String> = all.iter().map(|(name, _)| format!("[{name}]")).collect();
    match found.as_slice() {
        [] => Err(ConfigError::invalid(
            all.first().map_or(side, |(name, _)| name),
            format!("a {side} section is required: {}", names.join(" or ")),
        )),
        [one] => Ok(*one),
        [first, second, ..] => Err(ConfigError::invalid(second.0, format!("conflicts with [{}]: {conflict}", first.0))),
    }
}

/// Declares the connectors of one side. Each line is `section: "feature" =>
/// module::ConfigType`: the module is compiled only with the feature, and
/// its config type (a [`crate::SourceConfig`] or [`crate::SinkConfig`]) is
/// what `[section]` of the runner's config file holds.
#[macro_export]
#[doc(hidden)]
macro_rules! connectors {
    (
        $(#[$meta:meta])*
        $side:literal => pub struct $sections:ident: dyn $config:path {
            $( $(#[$m:meta])* $name:ident : $feature:literal => $module:ident :: $ty:ident ),* $(,)?
        }
    ) => {
        $( $(#[$m])* #[cfg(feature = $feature)] pub mod $module; )*

        $(#[$meta])*
        #[derive(Debug, Clone, Default)]
        pub struct $sections {
            $(
                #[cfg(feature = $feature)]
                #[doc = concat!("`[", stringify!($name), "]`")]
                pub $name: Option<$module::$ty>,
            )*
        }

        impl $sections {
            /// Every section of this side, built in or not, with its Cargo feature.
            pub const ALL: &'static [(&'static str, &'static str)] = &[ $( (stringify!($name), $feature) ),* ];

            /// The sections set in the config file, by name.
            pub fn configured(&self) -> Vec<(&'static str, &dyn $config)> {
                #[allow(unused_mut)]
                let mut found: Vec<(&'static str, &dyn $config)> = Vec::new();
                $(
                    #[cfg(feature = $feature)]
                    if let Some(c) = &self.$name {
                        found.push((stringify!($name), c));
                    }
                )*
                found
            }
        }

        impl<'de> serde::Deserialize<'de> for $sections {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Sections;
                impl<'de> serde::de::Visitor<'de> for Sections {
                    type Value = $sections;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str(concat!("the ", $side, " sections"))
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<$sections, A::Error> {
                        #[allow(unused_mut)]
                        let mut sections = $sections::default();
                        while let Some(key) = map.next_key::<String>()? {
                            match key.as_str() {
                                $(
                                    #[cfg(feature = $feature)]
                                    stringify!($name) => {
                                        if sections.$name.is_some() {
                                            return Err(<A::Error as serde::de::Error>::duplicate_field(stringify!($name)));
                                        }
                                        sections.$name = Some(map.next_value()?);
                                    }
                                )*
                                other => return Err($crate::registry::unknown_section(other, $side, $sections::ALL)),
                            }
                        }
                        Ok(sections)
                    }
                }
                deserializer.deserialize_map(Sections)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[(&str, &str)] = &[("postgres", "sink-postgres"), ("bigquery", "sink-bigquery")];

    #[test]
    fn sections_a_build_lacks_name_their_feature_and_unknown_ones_are_refused() {
        let e: toml::de::Error = unknown_section("bigquery", "destination", ALL);
        assert!(e.to_string().contains("this build has no bigquery destination"), "{e}");
        assert!(e.to_string().contains("sink-bigquery"), "{e}");
        let e: toml::de::Error = unknown_section("bogus", "destination", ALL);
        assert!(e.to_string().contains("unknown field `bogus`"), "{e}");
        assert!(e.to_string().contains("[postgres], [bigquery]"), "{e}");
    }

    #[test]
    fn exactly_one_section() {
        let none: Vec<(&'static str, &u8)> = Vec::new();
        let e = exactly_one(none, "destination", ALL, "one only").unwrap_err();
        assert!(
            e.to_string()
                .contains("a destination section is required: [postgres] or [bigquery]"),
            "{e}"
        );
        let two = vec![("postgres", &1u8), ("bigquery", &2u8)];
        let e = exactly_one(two, "destination", ALL, "one only").unwrap_err();
        assert!(e.to_string().contains("field `bigquery`: conflicts with [postgres]: one only"), "{e}");
        assert_eq!(exactly_one(vec![("postgres", &1u8)], "destination", ALL, "x").unwrap().0, "postgres");
    }
}
