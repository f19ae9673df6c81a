//! Reading a config file's text into a [`NodeConfig`] with every problem at once: a TOML
//! syntax error (a duplicate key is one) with its line, column and a caret under it; then each
//! unknown key and each value of the wrong type or outside its closed set, with its key path
//! and where it is in the file. After a problem the offending key is dropped and the rest is
//! read again (its default stands in), so one file reports all of them; the values are
//! checked afterwards by [`NodeConfig::validate`].

use std::fmt;

use serde_path_to_error::Segment;

use super::NodeConfig;

/// One problem of a config, with its key path (`storage.keep_snapshots`, `network.listen[0]`,
/// `(syntax)`, `(top level)`), what is wrong or allowed, and where it is in the file when
/// known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub message: String,
    pub at: Option<Location>,
}

impl Problem {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            key: key.into(),
            message: message.into(),
            at: None,
        }
    }
}

/// Where a problem is in the file: 1-based line and column (in characters), the line's text,
/// and how many characters the caret underlines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
    pub text: String,
    pub width: usize,
}

impl Location {
    /// The location of byte range `span` of `text`. Pure.
    pub fn of(text: &str, span: std::ops::Range<usize>) -> Location {
        let start = floor_char_boundary(text, span.start.min(text.len()));
        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
        let line_text = text[line_start..line_end].trim_end_matches('\r');
        let end = floor_char_boundary(text, span.end.clamp(start, line_end));
        Location {
            line: text[..start].matches('\n').count() + 1,
            column: text[line_start..start].chars().count() + 1,
            text: line_text.to_string(),
            width: text[start..end].chars().count().max(1),
        }
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl fmt::Display for Location {
    /// `line L, column C:` then the line and a caret under the spot, as rustc prints them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.line.to_string();
        let pad = " ".repeat(n.len());
        write!(
            f,
            "line {}, column {}:\n      {pad} |\n      {n} | {}\n      {pad} | {}{}",
            self.line,
            self.column,
            self.text,
            " ".repeat(self.column - 1),
            "^".repeat(self.width)
        )
    }
}

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

fn steps(path: &serde_path_to_error::Path) -> Vec<Step> {
    path.iter()
        .filter_map(|s| match s {
            Segment::Seq { index } => Some(Step::Index(*index)),
            Segment::Map { key } => Some(Step::Key(key.clone())),
            Segment::Enum { .. } | Segment::Unknown => None,
        })
        .collect()
}

/// Parses `text`: the config, or every problem found.
pub(super) fn parse(text: &str) -> Result<NodeConfig, Vec<Problem>> {
    let (config, problems) = parse_lenient(text);
    match config {
        Some(c) if problems.is_empty() => Ok(c),
        _ => Err(problems),
    }
}

/// The config read with every problem dropped (their keys at their defaults: what the values'
/// checks can still look at), the problems, and the key paths dropped. The config is `None`
/// when the text does not parse as TOML or a required key is missing.
pub(super) fn parse_lenient(text: &str) -> (Option<NodeConfig>, Vec<Problem>) {
    let syntax = |message: &str, span: Option<std::ops::Range<usize>>| {
        vec![Problem {
            key: "(syntax)".into(),
            message: message.trim().to_string(),
            at: span.map(|s| Location::of(text, s)),
        }]
    };
    let doc = match toml_edit::ImDocument::parse(text) {
        Ok(d) => d,
        Err(e) => return (None, syntax(e.message(), e.span())),
    };
    let mut table: toml::Table = match toml::from_str(text) {
        Ok(t) => t,
        Err(e) => return (None, syntax(e.message(), e.span())),
    };
    let mut problems = Vec::new();
    let mut removed: Vec<Vec<Step>> = Vec::new();
    // Each round drops one key; a file has far fewer.
    for _ in 0..256 {
        let value = toml::Value::Table(table.clone());
        let err = match serde_path_to_error::deserialize::<_, NodeConfig>(value) {
            Ok(c) => return (Some(c), problems),
            Err(e) => e,
        };
        let path = steps(err.path());
        let message = err.inner().message().trim().to_string();
        // A required key missing where one was dropped: the drop's doing, already reported.
        if message.starts_with("missing field") && removed.iter().any(|r| r.starts_with(&path)) {
            return (None, problems);
        }
        problems.push(Problem {
            key: key_path(&path),
            at: locate(&doc, &path, message.starts_with("unknown field"))
                .map(|s| Location::of(text, s)),
            message,
        });
        // The key goes (a table that lacks a required key goes whole): its default stands in.
        // At the top level nothing can stand in.
        match remove(&mut table, &path) {
            Some(dropped) => removed.push(dropped),
            None => return (None, problems),
        }
    }
    (None, problems)
}

/// `a.b[2].c`.
fn key_path(path: &[Step]) -> String {
    if path.is_empty() {
        return "(top level)".into();
    }
    let mut out = String::new();
    for s in path {
        match s {
            Step::Index(i) => out.push_str(&format!("[{i}]")),
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
        }
    }
    out
}

/// The byte span of the item at `path` in the document: its key for an unknown key, its value
/// otherwise (falling back to the other).
fn locate(
    doc: &toml_edit::ImDocument<&str>,
    path: &[Step],
    want_key: bool,
) -> Option<std::ops::Range<usize>> {
    let mut item: &toml_edit::Item = doc.as_item();
    let mut key_span = None;
    for s in path {
        match s {
            Step::Key(key) => {
                let (k, v) = item.as_table_like()?.get_key_value(key)?;
                key_span = k.span();
                item = v;
            }
            // An array element: its value (deeper steps are not followed).
            Step::Index(i) => return item.as_array()?.get(*i)?.span().or(key_span),
        }
    }
    let value_span = item.span();
    if want_key {
        key_span.or(value_span)
    } else {
        value_span.or(key_span)
    }
}

/// Drops the key at `path` from `table` (for an array element, the whole array) and returns
/// the path dropped; `None` when nothing can be dropped.
fn remove(table: &mut toml::Table, path: &[Step]) -> Option<Vec<Step>> {
    let keys: Vec<&String> = path
        .iter()
        .map_while(|s| match s {
            Step::Key(k) => Some(k),
            Step::Index(_) => None,
        })
        .collect();
    let (last, parents) = keys.split_last()?;
    let mut cur = table;
    for k in parents {
        match cur.get_mut(k.as_str()) {
            Some(toml::Value::Table(t)) => cur = t,
            _ => return None,
        }
    }
    cur.remove(last.as_str())?;
    Some(keys.into_iter().map(|k| Step::Key(k.clone())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_is_line_column_and_the_line() {
        let text = "a = 1\nbb = \"x\"\n";
        let l = Location::of(text, 6..8);
        assert_eq!(
            (l.line, l.column, l.text.as_str(), l.width),
            (2, 1, "bb = \"x\"", 2)
        );
        let shown = l.to_string();
        assert!(
            shown.contains("2 | bb = \"x\"") && shown.contains("| ^^"),
            "{shown}"
        );
    }
}
