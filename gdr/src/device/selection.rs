//! NCCL-style device selection: the `NCCL_IB_HCA` syntax.

use std::collections::HashMap;
use std::fmt;

use super::list::not_found;
use crate::error::{Error, Result};

const SYNTAX_HINT: &str =
    "write NAME or NAME:PORT items separated by commas, e.g. mlx5_0:1,mlx5_1; a leading ^ \
     excludes the listed devices, a leading = matches names exactly, ^NAME inside a list excludes one";

/// One `name[:port]` item.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    name: String,
    port: Option<u8>,
}

/// An NCCL-style device selection list, as in `NCCL_IB_HCA`.
///
/// * Items are `NAME` or `NAME:PORT` (ports 1 to 255), separated by commas; blanks around items
///   and empty items are ignored. An empty list selects every device.
/// * A leading `^` makes the whole list an exclusion list (`^mlx5_2,mlx5_3`); a leading `=` makes
///   names match exactly instead of by prefix (`=mlx5_1` does not match `mlx5_10`). Both may be
///   given, in either order (`^=mlx5_1`). This is NCCL's syntax.
/// * gdr's extension: inside an inclusion list, an item written `^NAME[:PORT]` excludes that
///   device (or that port), so `mlx5_0:1,^mlx5_2` reads as written. (NCCL would take `^mlx5_2`
///   there as a device name that matches nothing.) `=` inside a list is an error.
///
/// Which device and port is chosen is [`Selection::first_match`]'s rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    exact: bool,
    include: Vec<Item>,
    exclude: Vec<Item>,
    text: String,
}

fn syntax_error(text: &str, what: impl fmt::Display) -> Error {
    Error::invalid(format!("device selection {text:?}: {what}"), SYNTAX_HINT)
}

fn parse_item(text: &str, item: &str) -> Result<Item> {
    let (name, port) = match item.split_once(':') {
        Some((n, p)) => {
            let (n, p) = (n.trim(), p.trim());
            let port = Some(p)
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u8>().ok())
                .filter(|&p| p > 0)
                .ok_or_else(|| {
                    syntax_error(
                        text,
                        format_args!("port {p:?} of {n:?} is not a number from 1 to 255"),
                    )
                })?;
            (n, Some(port))
        }
        None => (item, None),
    };
    if name.is_empty() {
        return Err(syntax_error(
            text,
            format_args!("item {item:?} has no device name"),
        ));
    }
    if name.starts_with('=') || name.starts_with('^') {
        return Err(syntax_error(
            text,
            format_args!(
                "item {item:?}: `=` and `^` apply to the whole list only at its start (`^` also before one item of an inclusion list)"
            ),
        ));
    }
    Ok(Item {
        name: name.to_string(),
        port,
    })
}

impl Selection {
    /// Parses a list like `mlx5_0:1,mlx5_1`, `^mlx5_2`, `=mlx5_1` or `mlx5_0:1,^mlx5_2`. An
    /// empty string selects every device. Bad ports and empty names are
    /// [`Error::InvalidArgument`]s that quote the list and the offending value.
    pub fn parse(text: &str) -> Result<Selection> {
        let mut rest = text.trim();
        let mut exclude_all = false;
        let mut exact = false;
        loop {
            if let Some(r) = rest.strip_prefix('^') {
                exclude_all = true;
                rest = r;
            } else if let Some(r) = rest.strip_prefix('=') {
                exact = true;
                rest = r;
            } else {
                break;
            }
        }
        let mut include = Vec::new();
        let mut exclude = Vec::new();
        for item in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.strip_prefix('^') {
                Some(one) => exclude.push(parse_item(text, one.trim_start())?),
                None if exclude_all => exclude.push(parse_item(text, item)?),
                None => include.push(parse_item(text, item)?),
            }
        }
        Ok(Selection {
            exact,
            include,
            exclude,
            text: text.to_string(),
        })
    }

    fn name_matches(&self, pattern: &str, name: &str) -> bool {
        if self.exact {
            pattern == name
        } else {
            name.starts_with(pattern)
        }
    }

    fn item_matches(&self, item: &Item, name: &str, port: Option<u8>) -> bool {
        self.name_matches(&item.name, name)
            && match (item.port, port) {
                (None, _) => true,
                (Some(want), Some(p)) => want == p,
                // Asking about the whole device: an item for one port does not cover it.
                (Some(_), None) => false,
            }
    }

    /// Whether every port of `name` is excluded (by an item without a port).
    fn device_excluded(&self, name: &str) -> bool {
        self.exclude
            .iter()
            .any(|i| i.port.is_none() && self.name_matches(&i.name, name))
    }

    fn excluded(&self, name: &str, port: u8) -> bool {
        self.exclude
            .iter()
            .any(|i| self.item_matches(i, name, Some(port)))
    }

    /// Whether device `name`, port `port` is selected.
    pub fn allows(&self, name: &str, port: u8) -> bool {
        !self.excluded(name, port)
            && (self.include.is_empty()
                || self
                    .include
                    .iter()
                    .any(|i| self.item_matches(i, name, Some(port))))
    }

    /// The first device and port of `devices` (each a name and its number of ports, in the
    /// host's order) that the selection allows:
    ///
    /// * with inclusion items, in the list's order: for each item, the devices it names (the one
    ///   named exactly first, then those it is a prefix of, in the host's order), and the port it
    ///   names (or each port from 1);
    /// * with none (an empty or exclusion-only list): the devices in the host's order, each
    ///   port from 1.
    ///
    /// Excluded devices and ports are skipped, and so are ports the device lacks.
    pub fn first_match(&self, devices: &[(&str, u8)]) -> Option<(String, u8)> {
        let names: Vec<String> = devices.iter().map(|(n, _)| n.to_string()).collect();
        self.resolve(&names, |name| {
            Ok(devices
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |&(_, ports)| ports))
        })
        .ok()
    }

    /// [`Selection::first_match`] over `names`, asking `ports` for a device's port count only
    /// when one of its ports is a candidate (at most once per device). When nothing matches:
    /// an [`Error::InvalidArgument`] if an item named a port its device lacks, else the first
    /// error `ports` returned, else [`Error::DeviceNotFound`].
    pub(super) fn resolve(
        &self,
        names: &[String],
        mut ports: impl FnMut(&str) -> Result<u8>,
    ) -> Result<(String, u8)> {
        let mut counts: HashMap<&str, u8> = HashMap::new();
        let mut first_error: Option<Error> = None;
        let mut missing_port: Option<(&str, u8, u8)> = None;
        let mut count = |name: &str| -> u8 {
            if let Some(&n) = counts.get(name) {
                return n;
            }
            let n = match ports(name) {
                Ok(n) => n,
                Err(e) => {
                    first_error.get_or_insert(e);
                    0
                }
            };
            counts.insert(
                names
                    .iter()
                    .find(|s| s.as_str() == name)
                    .map_or("", |s| s.as_str()),
                n,
            );
            n
        };
        let found = if self.include.is_empty() {
            names
                .iter()
                .filter(|n| !self.device_excluded(n))
                .find_map(|n| {
                    (1..=count(n))
                        .find(|&p| !self.excluded(n, p))
                        .map(|p| (n.clone(), p))
                })
        } else {
            self.include.iter().find_map(|item| {
                // A device named exactly as the item comes before the ones it is a prefix of.
                let exact = names.iter().filter(|n| **n == item.name);
                let prefixed = names
                    .iter()
                    .filter(|n| **n != item.name && self.name_matches(&item.name, n));
                exact
                    .chain(prefixed)
                    .filter(|n| !self.device_excluded(n))
                    .find_map(|n| {
                        let have = count(n);
                        match item.port {
                            Some(p) if p > have => {
                                if have > 0 {
                                    missing_port.get_or_insert((n.as_str(), p, have));
                                }
                                None
                            }
                            Some(p) => (!self.excluded(n, p)).then(|| (n.clone(), p)),
                            None => (1..=have)
                                .find(|&p| !self.excluded(n, p))
                                .map(|p| (n.clone(), p)),
                        }
                    })
            })
        };
        if let Some(found) = found {
            return Ok(found);
        }
        if let Some((name, port, have)) = missing_port {
            return Err(Error::invalid(
                format!(
                    "device selection {:?}: {name} has {have} port{}, port {port} does not exist",
                    self.text,
                    if have == 1 { "" } else { "s" }
                ),
                "ports are numbered from 1; `ibv_devinfo` lists them",
            ));
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Err(not_found(&self.text, names))
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A two-HCA host with a Soft-RoCE device, as `ibv_devices` would list it.
    const HOST: &[(&str, u8)] = &[("mlx5_0", 2), ("mlx5_1", 1), ("mlx5_10", 1), ("rxe0", 1)];

    fn pick(spec: &str, devices: &[(&str, u8)]) -> Option<(String, u8)> {
        Selection::parse(spec).unwrap().first_match(devices)
    }

    fn resolve(spec: &str, devices: &[(&str, u8)]) -> Result<(String, u8)> {
        let names: Vec<String> = devices.iter().map(|(n, _)| n.to_string()).collect();
        Selection::parse(spec).unwrap().resolve(&names, |name| {
            Ok(devices.iter().find(|(n, _)| *n == name).unwrap().1)
        })
    }

    fn found(name: &str, port: u8) -> Option<(String, u8)> {
        Some((name.to_string(), port))
    }

    #[test]
    fn the_readme_list_picks_the_first_matching_device_and_port() {
        assert_eq!(pick("mlx5_0:1,^mlx5_2", HOST), found("mlx5_0", 1));
        assert_eq!(pick("rxe0:1,^mlx5_2", HOST), found("rxe0", 1));
        assert_eq!(pick("mlx5_0:2", HOST), found("mlx5_0", 2));
        assert_eq!(
            pick(" mlx5_1 , mlx5_0 ", HOST),
            found("mlx5_1", 1),
            "list order"
        );
        assert_eq!(pick("mlx5_0 : 2", HOST), found("mlx5_0", 2), "blanks");
    }

    #[test]
    fn prefix_exact_and_exclusion_lists() {
        assert_eq!(pick("mlx5", HOST), found("mlx5_0", 1), "prefix, host order");
        let reordered = [("mlx5_10", 1), ("mlx5_1", 1)];
        assert_eq!(
            pick("mlx5_1", &reordered),
            found("mlx5_1", 1),
            "the exact name first"
        );
        assert_eq!(pick("=mlx5_1", &reordered), found("mlx5_1", 1));
        assert_eq!(
            pick("mlx5_1,^mlx5_1", &reordered),
            None,
            "an exclusion matches by prefix too"
        );
        assert_eq!(
            pick("mlx5_1", &HOST[2..]),
            found("mlx5_10", 1),
            "prefix like NCCL"
        );
        assert_eq!(pick("=mlx5_1", &HOST[2..]), None, "exact");
        assert_eq!(pick("=rxe0", HOST), found("rxe0", 1));
        assert_eq!(pick("^nothing", HOST), found("mlx5_0", 1));
        assert_eq!(pick("^mlx5", HOST), found("rxe0", 1));
        assert_eq!(pick("^=mlx5_0,mlx5_1", HOST), found("mlx5_10", 1));
        assert_eq!(pick("=^mlx5_0", HOST), found("mlx5_1", 1), "either order");
        assert_eq!(pick("", HOST), found("mlx5_0", 1));
        assert_eq!(
            pick("^mlx5_0:1", HOST),
            found("mlx5_0", 2),
            "one port excluded"
        );
        assert_eq!(pick("mlx5_0,^mlx5_0:1", HOST), found("mlx5_0", 2));
        assert_eq!(pick("mlx5_0:1,^mlx5_0", HOST), None, "exclusion wins");
        assert_eq!(pick("^rxe0", &HOST[3..]), None);
    }

    #[test]
    fn allows_follows_the_same_rules() {
        let s = Selection::parse("mlx5_1:1,mlx5_0,^mlx5_0:2").unwrap();
        assert!(s.allows("mlx5_1", 1));
        assert!(!s.allows("mlx5_1", 2));
        assert!(s.allows("mlx5_0", 1));
        assert!(!s.allows("mlx5_0", 2));
        assert!(s.allows("mlx5_10", 1), "prefix match like NCCL");
        assert!(!s.allows("rxe0", 1));
        let ex = Selection::parse("^mlx5_0").unwrap();
        assert!(!ex.allows("mlx5_0", 1));
        assert!(ex.allows("rxe0", 1));
        let both = Selection::parse("^=mlx5_1").unwrap();
        assert!(both.allows("mlx5_10", 1));
        assert!(!both.allows("mlx5_1", 1));
        assert!(Selection::parse("").unwrap().allows("anything", 3));
        assert_eq!(Selection::parse("^a").unwrap().to_string(), "^a");
    }

    #[test]
    fn bad_ports_and_names_are_typed_errors_naming_the_value() {
        for (bad, value) in [
            ("mlx5_0:x", "\"x\""),
            ("mlx5_0:0", "\"0\""),
            ("mlx5_0:", "\"\""),
            ("mlx5_0:300", "\"300\""),
            ("mlx5_0:+1", "\"+1\""),
            ("mlx5_0:1:2", "\"1:2\""),
            ("rxe0:1,mlx5_0:-1", "\"-1\""),
            (":1", "no device name"),
            ("a,^", "no device name"),
            ("a,=b", "\"=b\""),
            ("a,^^b", "\"^b\""),
        ] {
            let e = Selection::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{bad}: {e}");
            let text = e.to_string();
            assert!(text.contains(value), "{bad}: {text}");
            assert!(
                text.contains(&format!("{bad:?}")),
                "{bad}: quotes the list: {text}"
            );
            assert!(e.hint().is_some());
        }
    }

    #[test]
    fn a_port_the_device_lacks_is_named() {
        let e = resolve("rxe0:2", HOST).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("rxe0 has 1 port, port 2 does not exist"),
            "{e}"
        );
        let e = resolve("mlx5_0:3", HOST).unwrap_err();
        assert!(e.to_string().contains("mlx5_0 has 2 ports, port 3"), "{e}");
        assert_eq!(
            resolve("mlx5_0:3,rxe0", HOST).unwrap(),
            ("rxe0".into(), 1),
            "a later item still matches"
        );
    }

    #[test]
    fn no_match_lists_the_devices() {
        match resolve("mlx5_9", HOST).unwrap_err() {
            Error::DeviceNotFound {
                wanted, available, ..
            } => {
                assert_eq!(wanted, "mlx5_9");
                assert_eq!(available, ["mlx5_0", "mlx5_1", "mlx5_10", "rxe0"]);
            }
            e => panic!("{e}"),
        }
        let e = resolve("", &[]).unwrap_err();
        assert!(matches!(e, Error::DeviceNotFound { .. }), "{e}");
        assert!(e.hint().unwrap().contains("Soft-RoCE"), "{e}");
    }

    #[test]
    fn port_counts_are_asked_once_and_only_for_candidates() {
        let asked = RefCell::new(Vec::new());
        let names: Vec<String> = HOST.iter().map(|(n, _)| n.to_string()).collect();
        let sel = Selection::parse("rxe0:2,mlx5_1,^mlx5").unwrap();
        // rxe0 lacks port 2 and mlx5_1 is excluded: nothing matches, and only rxe0 was asked.
        let r = sel.resolve(&names, |name| {
            asked.borrow_mut().push(name.to_string());
            Ok(HOST.iter().find(|(n, _)| *n == name).unwrap().1)
        });
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
        assert_eq!(
            *asked.borrow(),
            ["rxe0"],
            "excluded devices are never opened"
        );

        asked.borrow_mut().clear();
        let sel = Selection::parse("mlx5_0:2,mlx5_0:1,mlx5_0").unwrap();
        let r = sel.resolve(&names, |name| {
            asked.borrow_mut().push(name.to_string());
            Ok(2)
        });
        assert_eq!(r.unwrap(), ("mlx5_0".into(), 2));
        assert_eq!(*asked.borrow(), ["mlx5_0"]);
    }

    #[test]
    fn a_device_that_cannot_be_opened_is_skipped_then_reported() {
        let names: Vec<String> = ["broken0", "rxe0"].map(String::from).to_vec();
        let ports = |name: &str| {
            if name == "broken0" {
                Err(Error::verbs(
                    "ibv_open_device",
                    "device=broken0",
                    libc::EACCES,
                    "perms",
                ))
            } else {
                Ok(1)
            }
        };
        let sel = Selection::parse("").unwrap();
        assert_eq!(sel.resolve(&names, ports).unwrap(), ("rxe0".into(), 1));
        let sel = Selection::parse("broken").unwrap();
        let e = sel.resolve(&names, ports).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EACCES), "{e}");
    }

    #[test]
    fn hostile_lists_never_panic() {
        let long = "x".repeat(100_000);
        for spec in [
            long.as_str(),
            "ü:1,^ß",
            ",,,,",
            "^^^===",
            "a:255",
            "a:256",
            "a:99999999999999999999999",
            "\0:\0",
            "::::",
            "^,^,^",
        ] {
            if let Ok(s) = Selection::parse(spec) {
                let _ = s.first_match(HOST);
                let _ = s.allows("mlx5_0", 1);
            }
        }
        assert_eq!(pick("a:255", &[("a", 1)]), None);
        assert_eq!(pick("a:255", &[("a", 255)]), found("a", 255));
        assert_eq!(pick("", &[("zero_ports", 0), ("a", 1)]), found("a", 1));
    }
}
