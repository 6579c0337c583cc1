//! A writer's Avro schema, parsed from its JSON text into a tree the decoder
//! can walk, keeping every attribute.
//!
//! apache-avro's `Schema` drops custom attributes of primitive types, and
//! those attributes (`connect.name`, `connect.parameters`, `connect.type`)
//! are exactly what tells an `int` holding days from one holding a year. So
//! the decoder reads the JSON itself.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value as Json};

/// Deepest nesting of types accepted: far more than any table needs, and a
/// bound on recursion for hostile schemas.
const MAX_DEPTH: usize = 64;

/// An Avro type with its attributes.
#[derive(Debug, Clone)]
pub struct Schema {
    /// The type.
    pub kind: Kind,
    /// Attributes of the type's JSON object (`logicalType`, `connect.name`,
    /// ...); empty for a type written as a bare name.
    pub attrs: Arc<Map<String, Json>>,
}

/// The Avro type proper.
#[derive(Debug, Clone)]
pub enum Kind {
    /// `null`.
    Null,
    /// `boolean`.
    Boolean,
    /// `int`.
    Int,
    /// `long`.
    Long,
    /// `float`.
    Float,
    /// `double`.
    Double,
    /// `bytes`.
    Bytes,
    /// `string`.
    String,
    /// `fixed` of a size.
    Fixed(usize),
    /// `enum` with its symbols.
    Enum(Arc<[String]>),
    /// `array` of items.
    Array(Box<Schema>),
    /// `map` of values.
    Map(Box<Schema>),
    /// A union of branches.
    Union(Vec<Schema>),
    /// A record.
    Record(Arc<Record>),
}

/// A record type.
#[derive(Debug)]
pub struct Record {
    /// Full name.
    pub name: String,
    /// Fields in order.
    pub fields: Vec<Field>,
}

/// A record field.
#[derive(Debug)]
pub struct Field {
    /// Name.
    pub name: String,
    /// Type.
    pub schema: Schema,
    /// The field object's other attributes.
    pub attrs: Map<String, Json>,
}

impl Schema {
    /// A string attribute of the type.
    pub fn attr_str(&self, key: &str) -> Option<&str> {
        self.attrs.get(key).and_then(Json::as_str)
    }

    /// `connect.parameters.<key>` as text.
    pub fn connect_param(&self, key: &str) -> Option<&str> {
        self.attrs
            .get("connect.parameters")
            .and_then(|p| p.get(key))
            .and_then(Json::as_str)
    }

    /// The smallest number of bytes a datum of this type takes, used to
    /// bound array counts read from untrusted input.
    pub fn min_size(&self) -> usize {
        match &self.kind {
            Kind::Null => 0,
            Kind::Float => 4,
            Kind::Double => 8,
            Kind::Fixed(n) => *n,
            Kind::Record(r) => r.fields.iter().map(|f| f.schema.min_size()).sum(),
            _ => 1,
        }
    }
}

/// Parses a schema's JSON text.
pub fn parse(text: &str) -> Result<Schema, String> {
    let json: Json = serde_json::from_str(text).map_err(|e| format!("schema is not JSON: {e}"))?;
    let mut names = HashMap::new();
    parse_json(&json, "", &mut names, 0)
}

fn full_name(name: &str, namespace: &str) -> String {
    if name.contains('.') || namespace.is_empty() {
        name.to_string()
    } else {
        format!("{namespace}.{name}")
    }
}

fn primitive(name: &str) -> Option<Kind> {
    Some(match name {
        "null" => Kind::Null,
        "boolean" => Kind::Boolean,
        "int" => Kind::Int,
        "long" => Kind::Long,
        "float" => Kind::Float,
        "double" => Kind::Double,
        "bytes" => Kind::Bytes,
        "string" => Kind::String,
        _ => return None,
    })
}

fn parse_json(
    json: &Json,
    namespace: &str,
    names: &mut HashMap<String, Schema>,
    depth: usize,
) -> Result<Schema, String> {
    if depth > MAX_DEPTH {
        return Err("schema nests too deeply".into());
    }
    match json {
        Json::String(name) => {
            if let Some(kind) = primitive(name) {
                return Ok(Schema { kind, attrs: Arc::default() });
            }
            names
                .get(&full_name(name, namespace))
                .or_else(|| names.get(name.as_str()))
                .cloned()
                // A record that names itself is recursive: change events
                // never are, so it is refused rather than supported.
                .ok_or_else(|| format!("unknown or recursive type name {name}"))
        }
        Json::Array(branches) => {
            let branches = branches
                .iter()
                .map(|b| parse_json(b, namespace, names, depth + 1))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Schema { kind: Kind::Union(branches), attrs: Arc::default() })
        }
        Json::Object(obj) => parse_object(obj, namespace, names, depth),
        _ => Err("schema element is neither a name, a union nor an object".into()),
    }
}

fn parse_object(
    obj: &Map<String, Json>,
    namespace: &str,
    names: &mut HashMap<String, Schema>,
    depth: usize,
) -> Result<Schema, String> {
    let ty = obj.get("type").ok_or("type object without \"type\"")?;
    let mut attrs = obj.clone();
    attrs.remove("type");
    let type_name = match ty {
        Json::String(s) => s.as_str(),
        // `{"type": {...}}` or `{"type": [...]}`: the inner schema is the
        // type; outer attributes are kept for logical types written there.
        other => {
            let inner = parse_json(other, namespace, names, depth + 1)?;
            let mut merged = (*inner.attrs).clone();
            merged.extend(attrs);
            return Ok(Schema { kind: inner.kind, attrs: Arc::new(merged) });
        }
    };
    if let Some(kind) = primitive(type_name) {
        return Ok(Schema { kind, attrs: Arc::new(attrs) });
    }
    let own_name = |obj: &Map<String, Json>| -> Result<(String, String), String> {
        let name = obj.get("name").and_then(Json::as_str).ok_or("named type without a name")?;
        let ns = obj.get("namespace").and_then(Json::as_str).unwrap_or(namespace);
        let full = full_name(name, ns);
        let ns = match full.rfind('.') {
            Some(i) => full[..i].to_string(),
            None => String::new(),
        };
        Ok((full, ns))
    };
    match type_name {
        "record" | "error" => {
            let (full, ns) = own_name(obj)?;
            let fields_json = obj.get("fields").and_then(Json::as_array).ok_or("record without fields")?;
            let mut fields = Vec::with_capacity(fields_json.len());
            for f in fields_json {
                let fo = f.as_object().ok_or("record field is not an object")?;
                let name = fo.get("name").and_then(Json::as_str).ok_or("record field without a name")?;
                let ft = fo.get("type").ok_or("record field without a type")?;
                let schema = parse_json(ft, &ns, names, depth + 1)?;
                let mut fattrs = fo.clone();
                fattrs.remove("type");
                fattrs.remove("name");
                fields.push(Field { name: name.to_string(), schema, attrs: fattrs });
            }
            let schema = Schema {
                kind: Kind::Record(Arc::new(Record { name: full.clone(), fields })),
                attrs: Arc::new(attrs),
            };
            names.insert(full, schema.clone());
            Ok(schema)
        }
        "enum" => {
            let (full, _) = own_name(obj)?;
            let symbols = obj
                .get("symbols")
                .and_then(Json::as_array)
                .ok_or("enum without symbols")?
                .iter()
                .map(|s| s.as_str().map(str::to_string).ok_or("enum symbol is not a string"))
                .collect::<Result<Vec<_>, _>>()?;
            let schema = Schema {
                kind: Kind::Enum(symbols.into()),
                attrs: Arc::new(attrs),
            };
            names.insert(full, schema.clone());
            Ok(schema)
        }
        "fixed" => {
            let (full, _) = own_name(obj)?;
            let size = obj
                .get("size")
                .and_then(Json::as_u64)
                .and_then(|s| usize::try_from(s).ok())
                .ok_or("fixed without a valid size")?;
            let schema = Schema { kind: Kind::Fixed(size), attrs: Arc::new(attrs) };
            names.insert(full, schema.clone());
            Ok(schema)
        }
        "array" => {
            let items = obj.get("items").ok_or("array without items")?;
            let items = parse_json(items, namespace, names, depth + 1)?;
            Ok(Schema {
                kind: Kind::Array(Box::new(items)),
                attrs: Arc::new(attrs),
            })
        }
        "map" => {
            let values = obj.get("values").ok_or("map without values")?;
            let values = parse_json(values, namespace, names, depth + 1)?;
            Ok(Schema {
                kind: Kind::Map(Box::new(values)),
                attrs: Arc::new(attrs),
            })
        }
        other => {
            // A bare reference written as {"type": "Name"}.
            let referenced = parse_json(&Json::String(other.to_string()), namespace, names, depth + 1)?;
            Ok(referenced)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_resolve_within_namespace() {
        let s = parse(
            r#"{"type":"record","name":"E","namespace":"a.b","fields":[
                {"name":"x","type":["null",{"type":"record","name":"V","fields":[{"name":"i","type":"int"}]}]},
                {"name":"y","type":["null","V"]},
                {"name":"z","type":"a.b.V"}]}"#,
        )
        .expect("parses");
        let Kind::Record(r) = &s.kind else {
            panic!("record expected")
        };
        assert_eq!(r.fields.len(), 3);
        assert!(matches!(&r.fields[2].schema.kind, Kind::Record(v) if v.name == "a.b.V"));
    }

    #[test]
    fn recursion_and_garbage_are_errors() {
        assert!(parse(r#"{"type":"record","name":"L","fields":[{"name":"n","type":["null","L"]}]}"#).is_err());
        assert!(parse("42").is_err());
        assert!(parse("{").is_err());
        assert!(parse(r#"{"type":"fixed","name":"F","size":-1}"#).is_err());
    }

    #[test]
    fn primitive_attributes_are_kept() {
        let s = parse(r#"{"type":"int","connect.name":"io.debezium.time.Date"}"#).expect("parses");
        assert!(matches!(s.kind, Kind::Int));
        assert_eq!(s.attr_str("connect.name"), Some("io.debezium.time.Date"));
    }
}
