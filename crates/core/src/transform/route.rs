//! `transform.route`: a table name built from the event's fields.

use serde_json::{Map, Value};

/// Longest field value a route takes.
const MAX_VALUE: usize = 64;

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Field(String),
}

/// A parsed route template: text, and `{field}` tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    parts: Vec<Part>,
}

impl Route {
    /// Parse `events_{type}`; the problem as text.
    pub fn parse(template: &str) -> Result<Self, String> {
        if template.trim().is_empty() || template.len() > 255 || template.contains('\0') {
            return Err("must be 1-255 characters without NUL".into());
        }
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = after
                .find('}')
                .ok_or_else(|| format!("`{{` at byte {} is not closed", template.len() - rest.len() + open))?;
            let field = after[..close].trim();
            if field.is_empty() || field.contains('{') || field.split('.').any(str::is_empty) {
                return Err(format!("`{{{}}}` does not name a field", &after[..close]));
            }
            parts.push(Part::Field(field.to_string()));
            rest = &after[close + 1..];
        }
        if rest.contains('}') {
            return Err("a `}` has no `{`".into());
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        if !parts.iter().any(|p| matches!(p, Part::Field(_))) {
            return Err("names no `{field}`; set the stream's `table` for one fixed table".into());
        }
        Ok(Self { parts })
    }

    /// The tables a route template can name, as a `*` pattern (`ev_{kind}` → `ev_*`), so a
    /// restarted stream finds the tables it routed to before.
    pub fn pattern(template: &str) -> String {
        let mut out = String::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            out.push('*');
            rest = rest[open..].find('}').map_or("", |close| &rest[open + close + 1..]);
        }
        out.push_str(rest);
        out
    }

    /// The table for `event`, with `*` as `star` (the record's route) where it has one.
    pub fn render(&self, event: &Map<String, Value>, star: Option<&str>) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => match star {
                    Some(star) => out.push_str(&text.replace('*', star)),
                    None => out.push_str(text),
                },
                Part::Field(field) => {
                    let value = super::mapping::lookup(event, field);
                    let text = match value {
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Number(n)) => n.to_string(),
                        Some(Value::Bool(b)) => b.to_string(),
                        _ => return Err(format!("route: field `{field}` is missing, null or not a scalar")),
                    };
                    let ok = !text.is_empty()
                        && text.len() <= MAX_VALUE
                        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                    if !ok {
                        return Err(format!(
                            "route: the value of `{field}` cannot name a table (1-{MAX_VALUE} letters, digits, `_` or `-`)"
                        ));
                    }
                    out.push_str(&text);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn a_route_takes_field_values_and_refuses_what_cannot_name_a_table() {
        let route = Route::parse("ev_{kind}_{meta.region}").unwrap();
        let event = map(json!({"kind": "click", "meta": {"region": "eu-1"}}));
        assert_eq!(route.render(&event, None).unwrap(), "ev_click_eu-1");
        let bad = map(json!({"kind": "a; DROP TABLE x", "meta": {"region": "eu"}}));
        assert!(route.render(&bad, None).unwrap_err().contains("cannot name a table"));
        let missing = map(json!({"meta": {"region": "eu"}}));
        assert!(route.render(&missing, None).unwrap_err().contains("`kind` is missing"));
        assert!(Route::parse("plain").unwrap_err().contains("names no"));
        assert!(Route::parse("a_{kind").unwrap_err().contains("not closed"));
        assert!(Route::parse("a_{}").unwrap_err().contains("does not name"));
        assert_eq!(Route::pattern("ev_{kind}_{meta.region}"), "ev_*_*");
        let star = Route::parse("*_{kind}").unwrap();
        assert_eq!(star.render(&event, Some("orders")).unwrap(), "orders_click");
    }
}
