//! One table of the containerd config as the migration reads it: typed getters that record
//! which keys were read, so every key nobody read is reported instead of silently dropped.

use std::collections::BTreeSet;

use toml::{Table, Value};

use super::report::{Report, join_key};

/// A key crius has no setting for, with the value at which crius behaves as containerd
/// would (`neutral`): any other value is reported with `reason`.
pub(crate) struct Rule {
    pub key: &'static str,
    pub neutral: fn(&Value) -> bool,
    pub reason: &'static str,
}

/// Neutral whatever the value: the key changes nothing crius does.
pub(crate) fn any(_: &Value) -> bool {
    true
}

/// Neutral at no value: crius always behaves differently from what the key asks.
pub(crate) fn never(_: &Value) -> bool {
    false
}

pub(crate) fn is_false(v: &Value) -> bool {
    v.as_bool() == Some(false)
}

pub(crate) fn is_true(v: &Value) -> bool {
    v.as_bool() == Some(true)
}

/// `false`, `0`, `""`, `[]`, `{}` or a zero duration such as `"0s"`.
pub(crate) fn is_empty(v: &Value) -> bool {
    match v {
        Value::Boolean(b) => !b,
        Value::Integer(i) => *i == 0,
        Value::String(s) => {
            s.is_empty() || super::duration::parse_go_duration(s).is_some_and(|d| d.is_zero())
        }
        Value::Array(a) => a.is_empty(),
        Value::Table(t) => t.is_empty(),
        _ => false,
    }
}

/// The name of a TOML value's type, for messages.
pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

pub(crate) struct Section<'a> {
    path: String,
    table: &'a Table,
    used: BTreeSet<String>,
}

impl<'a> Section<'a> {
    pub(crate) fn new(path: String, table: &'a Table) -> Self {
        Self {
            path,
            table,
            used: BTreeSet::new(),
        }
    }

    /// The full path of `key` in this table.
    pub(crate) fn key(&self, key: &str) -> String {
        join_key(&self.path, key)
    }

    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// The raw value of `key`, now counted as read.
    pub(crate) fn take(&mut self, key: &str) -> Option<&'a Value> {
        let value = self.table.get(key)?;
        self.used.insert(key.to_string());
        Some(value)
    }

    /// The raw value of `key`, not counted as read.
    pub(crate) fn peek(&self, key: &str) -> Option<&'a Value> {
        self.table.get(key)
    }

    /// Marks every key as read (the whole table was reported as one).
    pub(crate) fn take_all(&mut self) {
        self.used.extend(self.table.keys().cloned());
    }

    /// The keys of this table nobody has read yet.
    pub(crate) fn unread_keys(&self) -> Vec<String> {
        self.table
            .keys()
            .filter(|k| !self.used.contains(*k))
            .cloned()
            .collect()
    }

    fn typed<T>(
        &mut self,
        key: &str,
        report: &mut Report,
        want: &str,
        get: impl Fn(&'a Value) -> Option<T>,
    ) -> Option<T> {
        let value = self.take(key)?;
        let got = get(value);
        if got.is_none() {
            report.not_carried(
                self.key(key),
                format!("expected {want}, found {}", type_name(value)),
            );
        }
        got
    }

    pub(crate) fn string(&mut self, key: &str, report: &mut Report) -> Option<String> {
        self.typed(key, report, "a string", |v| v.as_str().map(str::to_string))
    }

    pub(crate) fn bool(&mut self, key: &str, report: &mut Report) -> Option<bool> {
        self.typed(key, report, "a boolean", Value::as_bool)
    }

    pub(crate) fn int(&mut self, key: &str, report: &mut Report) -> Option<i64> {
        self.typed(key, report, "an integer", Value::as_integer)
    }

    pub(crate) fn strings(&mut self, key: &str, report: &mut Report) -> Option<Vec<String>> {
        self.typed(key, report, "an array of strings", |v| {
            v.as_array()?
                .iter()
                .map(|item| item.as_str().map(str::to_string))
                .collect()
        })
    }

    /// The sub-table `key`, as a section of its own.
    pub(crate) fn table(&mut self, key: &str, report: &mut Report) -> Option<Section<'a>> {
        let path = self.key(key);
        self.typed(key, report, "a table", Value::as_table)
            .map(|table| Section::new(path, table))
    }

    /// Reports every present key of `rules` whose value is not neutral.
    pub(crate) fn unsupported(&mut self, rules: &[Rule], report: &mut Report) {
        for rule in rules {
            if let Some(value) = self.take(rule.key)
                && !(rule.neutral)(value)
            {
                report.not_carried(self.key(rule.key), rule.reason);
            }
        }
    }

    /// Reports every key nobody read: the migration does not know it.
    pub(crate) fn finish(self, report: &mut Report) {
        for key in self.unread_keys() {
            report.not_carried(
                self.key(&key),
                "not a setting crius knows an equivalent for (unknown to the migration)",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unread_and_mistyped_keys_are_reported() {
        let table: Table = toml::from_str("a = 1\nb = \"x\"\nc = true\n").unwrap();
        let mut report = Report::default();
        let mut section = Section::new("p".into(), &table);
        assert_eq!(section.int("a", &mut report), Some(1));
        assert_eq!(section.int("b", &mut report), None);
        section.finish(&mut report);
        assert_eq!(report.not_carried_keys(), vec!["p.b", "p.c"]);
        assert!(
            report.notes[0]
                .reason
                .contains("expected an integer, found a string")
        );
    }

    #[test]
    fn neutral_values() {
        for empty in ["\"\"", "0", "false", "[]", "{}", "\"0s\""] {
            let v: Value = toml::from_str::<Table>(&format!("v = {empty}")).unwrap()["v"].clone();
            assert!(is_empty(&v), "{empty}");
        }
        assert!(!is_empty(&Value::String("1s".into())));
    }
}
