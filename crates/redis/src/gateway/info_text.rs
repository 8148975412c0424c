//! Rewriting Redis's `INFO` text so that it describes the gateway's clients rather than the
//! adaptor's plumbing: the fields of `# Clients` and `# Stats` the gateway knows are replaced,
//! `# Commandstats`, `# Errorstats` and `# Latencystats` become the gateway's own, and
//! `# Keyspace` loses the records' database (or, when the records share database 0, their
//! keys' counts). Everything else is Redis's, byte for byte, in Redis's layout: sections
//! separated by an empty line, every line ending in CRLF.

/// What the gateway puts in place of Redis's figures.
#[derive(Debug, Default, Clone)]
pub(super) struct Facts {
    /// `# Clients` fields replaced (a field Redis does not send is not added).
    pub clients: Vec<(&'static str, String)>,
    /// `# Stats` fields replaced.
    pub stats: Vec<(&'static str, String)>,
    /// The lines of `# Commandstats`, `# Errorstats`, `# Latencystats`.
    pub commandstats: Vec<String>,
    pub errorstats: Vec<String>,
    pub latencystats: Vec<String>,
    /// The adaptor's records' database: its `# Keyspace` line goes.
    pub record_db: u32,
    /// With the records in database 0: how many of its keys are the adaptor's, and how many of
    /// those have a time to live (taken off database 0's counts).
    pub record_keys: u64,
    pub record_expires: u64,
}

struct Section<'a> {
    header: Option<&'a [u8]>,
    lines: Vec<std::borrow::Cow<'a, [u8]>>,
}

fn split_lines(text: &[u8]) -> Vec<&[u8]> {
    let mut lines = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        match rest.windows(2).position(|pair| pair == b"\r\n") {
            Some(end) => {
                lines.push(&rest[..end]);
                rest = &rest[end + 2..];
            }
            None => {
                lines.push(rest);
                rest = &[];
            }
        }
    }
    lines
}

fn sections(text: &[u8]) -> Vec<Section<'_>> {
    let mut out: Vec<Section<'_>> = Vec::new();
    for line in split_lines(text) {
        if line.starts_with(b"# ") {
            out.push(Section {
                header: Some(line),
                lines: Vec::new(),
            });
        } else if line.is_empty() {
            // The separator between sections.
        } else {
            match out.last_mut() {
                Some(section) => section.lines.push(line.into()),
                None => out.push(Section {
                    header: None,
                    lines: vec![line.into()],
                }),
            }
        }
    }
    out
}

fn replace_fields<'a>(lines: &mut [std::borrow::Cow<'a, [u8]>], fields: &[(&'static str, String)]) {
    for line in lines.iter_mut() {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let key = &line[..colon];
        if let Some((name, value)) = fields.iter().find(|(name, _)| name.as_bytes() == key) {
            *line = format!("{name}:{value}").into_bytes().into();
        }
    }
}

/// `db<N>:keys=…,expires=…,…` → N.
fn keyspace_db(line: &[u8]) -> Option<u32> {
    let rest = line.strip_prefix(b"db")?;
    let colon = rest.iter().position(|&b| b == b':')?;
    std::str::from_utf8(&rest[..colon]).ok()?.parse().ok()
}

/// Database 0's line without the adaptor's keys; `None` if no key is left.
fn without_records(line: &[u8], keys: u64, expires: u64) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(line).ok()?;
    let (db, fields) = text.split_once(':')?;
    let mut left = 0;
    let fields: Vec<String> = fields
        .split(',')
        .map(|field| match field.split_once('=') {
            Some(("keys", count)) => {
                left = count.parse::<u64>().unwrap_or(0).saturating_sub(keys);
                format!("keys={left}")
            }
            Some(("expires", count)) => format!(
                "expires={}",
                count.parse::<u64>().unwrap_or(0).saturating_sub(expires)
            ),
            _ => field.to_owned(),
        })
        .collect();
    (left > 0).then(|| format!("{db}:{}", fields.join(",")).into_bytes())
}

fn owned<'a>(lines: &[String]) -> Vec<std::borrow::Cow<'a, [u8]>> {
    lines
        .iter()
        .map(|line| line.clone().into_bytes().into())
        .collect()
}

/// Redis's `INFO` text with the gateway's facts in place of Redis's.
pub(super) fn rewrite(text: &[u8], facts: &Facts) -> Vec<u8> {
    let mut sections = sections(text);
    for section in &mut sections {
        let Some(header) = section.header else {
            continue;
        };
        let name = String::from_utf8_lossy(&header[2..]).to_ascii_lowercase();
        match name.as_str() {
            "clients" => replace_fields(&mut section.lines, &facts.clients),
            "stats" => replace_fields(&mut section.lines, &facts.stats),
            "commandstats" => section.lines = owned(&facts.commandstats),
            "errorstats" => section.lines = owned(&facts.errorstats),
            "latencystats" => section.lines = owned(&facts.latencystats),
            "keyspace" => {
                let lines = std::mem::take(&mut section.lines);
                for line in lines {
                    match keyspace_db(&line) {
                        Some(db) if db == facts.record_db && db != 0 => {}
                        Some(0) if facts.record_db == 0 => {
                            if let Some(line) =
                                without_records(&line, facts.record_keys, facts.record_expires)
                            {
                                section.lines.push(line.into());
                            }
                        }
                        _ => section.lines.push(line),
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(text.len() + 256);
    for (index, section) in sections.iter().enumerate() {
        if index > 0 {
            out.extend_from_slice(b"\r\n");
        }
        if let Some(header) = section.header {
            out.extend_from_slice(header);
            out.extend_from_slice(b"\r\n");
        }
        for line in &section.lines {
            out.extend_from_slice(line);
            out.extend_from_slice(b"\r\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `INFO everything` of a Redis 7.0.15 with keys in databases 0 and 1 (`pmnet:*` ones in
    /// both), a few commands run and a few errors.
    const REDIS_7_0: &[u8] = include_bytes!("testdata/redis-7.0-info-everything.txt");

    fn lines_of<'a>(text: &'a str, section: &str) -> Vec<&'a str> {
        let header = format!("# {section}\r\n");
        let start = text.find(&header).expect(section) + header.len();
        text[start..]
            .split("\r\n")
            .take_while(|line| !line.is_empty())
            .collect()
    }

    fn facts() -> Facts {
        Facts {
            clients: vec![
                ("connected_clients", "3".to_owned()),
                ("maxclients", "1024".to_owned()),
                ("total_watched_keys", "9".to_owned()),
            ],
            stats: vec![("total_commands_processed", "110".to_owned())],
            commandstats: vec![
                "cmdstat_get:calls=10,usec=30,usec_per_call=3.00,rejected_calls=0,failed_calls=0"
                    .to_owned(),
            ],
            errorstats: Vec::new(),
            latencystats: vec!["latency_percentiles_usec_get:p50=3.007".to_owned()],
            record_db: 1,
            record_keys: 0,
            record_expires: 0,
        }
    }

    #[test]
    fn the_text_is_unchanged_where_the_gateway_knows_nothing() {
        let none = Facts {
            record_db: 99,
            ..Facts::default()
        };
        let text = std::str::from_utf8(REDIS_7_0).unwrap();
        let rewritten = rewrite(REDIS_7_0, &none);
        let rewritten = std::str::from_utf8(&rewritten).unwrap();
        // Only the three sections the gateway owns changed (emptied).
        for section in ["Server", "Clients", "Memory", "Stats", "Keyspace", "CPU"] {
            assert_eq!(lines_of(text, section), lines_of(rewritten, section));
        }
        assert!(lines_of(rewritten, "Commandstats").is_empty());
        assert!(!lines_of(text, "Commandstats").is_empty());
        assert!(rewritten.contains("# Modules\r\n\r\n# Commandstats\r\n\r\n# Errorstats\r\n"));
        assert!(rewritten.ends_with("\r\n") && !rewritten.ends_with("\r\n\r\n"));
        // With Redis's own stats in place, the text is Redis's byte for byte.
        let keep = |name: &str| {
            lines_of(text, name)
                .into_iter()
                .map(str::to_owned)
                .collect()
        };
        let plain = Facts {
            record_db: 99,
            commandstats: keep("Commandstats"),
            errorstats: keep("Errorstats"),
            latencystats: keep("Latencystats"),
            ..Facts::default()
        };
        assert_eq!(rewrite(REDIS_7_0, &plain), REDIS_7_0);
    }

    #[test]
    fn clients_stats_and_the_gateways_own_sections_replace_redis_figures() {
        let rewritten = rewrite(REDIS_7_0, &facts());
        let text = std::str::from_utf8(&rewritten).unwrap();
        let clients = lines_of(text, "Clients");
        assert_eq!(clients[0], "connected_clients:3");
        assert!(clients.contains(&"maxclients:1024"));
        assert!(clients.contains(&"cluster_connections:0"), "kept");
        assert!(
            !clients
                .iter()
                .any(|line| line.starts_with("total_watched_keys")),
            "a field Redis 7.0 does not send is not added"
        );
        assert_eq!(clients.len(), 8, "{clients:?}");
        let stats = lines_of(text, "Stats");
        assert!(stats.contains(&"total_commands_processed:110"));
        assert_eq!(
            lines_of(text, "Commandstats"),
            ["cmdstat_get:calls=10,usec=30,usec_per_call=3.00,rejected_calls=0,failed_calls=0"]
        );
        assert!(lines_of(text, "Errorstats").is_empty());
        assert_eq!(
            lines_of(text, "Latencystats"),
            ["latency_percentiles_usec_get:p50=3.007"]
        );
        assert!(!text.contains("cmdstat_select") && !text.contains("errorstat_WRONGTYPE"));
    }

    #[test]
    fn the_keyspace_loses_the_records_database() {
        let text = String::from_utf8(rewrite(REDIS_7_0, &facts())).unwrap();
        let keyspace = lines_of(&text, "Keyspace");
        assert_eq!(keyspace.len(), 1, "{keyspace:?}");
        assert!(
            keyspace[0].starts_with("db0:keys=4,expires=1,"),
            "{keyspace:?}"
        );
    }

    #[test]
    fn with_the_records_in_database_0_their_keys_are_not_counted() {
        let mut shared = facts();
        shared.record_db = 0;
        shared.record_keys = 2;
        shared.record_expires = 1;
        let text = String::from_utf8(rewrite(REDIS_7_0, &shared)).unwrap();
        let keyspace = lines_of(&text, "Keyspace");
        assert_eq!(keyspace.len(), 2, "{keyspace:?}");
        assert!(
            keyspace[0].starts_with("db0:keys=2,expires=0,avg_ttl="),
            "{keyspace:?}"
        );
        assert!(keyspace[1].starts_with("db1:keys=2,"), "{keyspace:?}");
        shared.record_keys = 4;
        let text = String::from_utf8(rewrite(REDIS_7_0, &shared)).unwrap();
        assert!(
            lines_of(&text, "Keyspace")[0].starts_with("db1:"),
            "a database left with no key is not shown"
        );
    }

    proptest::proptest! {
        /// Whatever Redis (or something posing as it) answers, the rewrite does not panic.
        #[test]
        fn any_text_is_rewritten_without_panicking(text in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just(b"\r\n".to_vec()),
                proptest::strategy::Just(b"# Keyspace".to_vec()),
                proptest::strategy::Just(b"# Clients".to_vec()),
                proptest::strategy::Just(b"db0:keys=".to_vec()),
                proptest::strategy::Just(b"db1:".to_vec()),
                proptest::strategy::Just(b"connected_clients:".to_vec()),
                proptest::collection::vec(proptest::num::u8::ANY, 0..8),
            ],
            0..40,
        )) {
            let text = text.concat();
            let mut shared = facts();
            shared.record_db = 0;
            shared.record_keys = 3;
            let _ = rewrite(&text, &facts());
            let _ = rewrite(&text, &shared);
        }
    }

    #[test]
    fn one_section_and_an_empty_reply_keep_their_shape() {
        let one =
            b"# Keyspace\r\ndb0:keys=1,expires=0,avg_ttl=0\r\ndb1:keys=5,expires=5,avg_ttl=9\r\n";
        assert_eq!(
            rewrite(one, &facts()),
            b"# Keyspace\r\ndb0:keys=1,expires=0,avg_ttl=0\r\n"
        );
        assert_eq!(rewrite(b"", &facts()), b"");
        let two = b"# Modules\r\n\r\n# Keyspace\r\n";
        assert_eq!(rewrite(two, &facts()), two);
        // Lines of no section, or not `key:value`, are passed on.
        let odd = b"no header\r\n# Clients\r\nconnected_clients\r\n";
        assert_eq!(
            rewrite(odd, &facts()),
            b"no header\r\n\r\n# Clients\r\nconnected_clients\r\n"
        );
    }
}
