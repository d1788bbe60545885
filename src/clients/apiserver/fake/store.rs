//! The fake's objects and what a write does to them, without I/O: create, update, patch,
//! delete as the API server's generic registry does them (resourceVersion from one global
//! counter, uid and creationTimestamp on create, 409 on a stale resourceVersion or a failed
//! precondition, graceful deletion of bound pods, finalizers), each change kept in a history
//! the watches read from.

use std::collections::BTreeMap;

use kube::core::Status;
use serde_json::{Map, Value, json};

/// A resource: API group ("" for the core group), version and plural name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Gvr {
    pub group: String,
    pub version: String,
    pub resource: String,
}

impl Gvr {
    pub(crate) fn new(group: &str, version: &str, resource: &str) -> Self {
        Gvr {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
        }
    }

    /// The name upstream's messages use: `pods`, `leases.coordination.k8s.io`.
    pub(crate) fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    /// `v1`, `coordination.k8s.io/v1`.
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether writes to the object leave its status alone (it has a `status` subresource).
    /// Upstream's list is longer; these are the ones a node touches.
    fn has_status_subresource(&self) -> bool {
        matches!(
            self.resource.as_str(),
            "pods"
                | "nodes"
                | "namespaces"
                | "services"
                | "persistentvolumes"
                | "persistentvolumeclaims"
                | "certificatesigningrequests"
                | "replicationcontrollers"
                | "deployments"
                | "replicasets"
                | "statefulsets"
                | "daemonsets"
                | "jobs"
        )
    }
}

/// Where an object is: its resource, namespace ("" for cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Key {
    pub gvr: Gvr,
    pub namespace: String,
    pub name: String,
}

/// One write, as the watches see it: the object before and after (None: not there).
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub rv: u64,
    pub key: Key,
    pub before: Option<Value>,
    pub after: Option<Value>,
    /// The object the event carries: `after`, or for a deletion the last state with the
    /// deletion's resourceVersion.
    pub object: Value,
}

/// The objects and their history.
#[derive(Debug, Default)]
pub(crate) struct Store {
    objects: BTreeMap<Key, Value>,
    /// The newest resourceVersion given out.
    pub rv: u64,
    uids: u64,
    /// Changes after `compacted`, oldest first.
    pub history: Vec<Change>,
    /// Watches from a resourceVersion older than this are answered 410 Gone.
    pub compacted: u64,
}

/// How a write should treat the status: the main resource keeps it (for resources with a
/// status subresource), the `status` subresource changes only it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Main,
    Status,
}

impl Part {
    pub(crate) fn of(subresource: Option<&str>) -> Part {
        if subresource == Some("status") {
            Part::Status
        } else {
            Part::Main
        }
    }
}

/// An error answer as the API server gives it: a `Status` with upstream's code and reason.
pub(crate) fn status(code: u16, reason: &str, message: impl Into<String>) -> Status {
    let mut s = Status::failure(&message.into(), reason);
    s.code = code;
    s
}

/// The reason upstream gives with each code.
pub(crate) fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

pub(crate) fn not_found(key: &Key) -> Status {
    status(
        404,
        "NotFound",
        format!("{} \"{}\" not found", key.gvr.qualified(), key.name),
    )
}

fn conflict(key: &Key, why: &str) -> Status {
    status(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{}\": {why}",
            key.gvr.qualified(),
            key.name
        ),
    )
}

const STALE: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

fn meta(object: &mut Value) -> &mut Map<String, Value> {
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    object["metadata"].as_object_mut().expect("an object")
}

fn rv_of(object: &Value) -> Option<&str> {
    object["metadata"]["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
}

/// RFC 3339 to the second, as the API server writes timestamps.
pub(crate) fn timestamp(at: jiff::Timestamp) -> String {
    jiff::Timestamp::from_second(at.as_second())
        .unwrap_or(at)
        .to_string()
}

impl Store {
    pub(crate) fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// The objects of `gvr`, in `namespace` if given, in key order.
    pub(crate) fn list<'a>(
        &'a self,
        gvr: &'a Gvr,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects
            .iter()
            .filter(move |(k, _)| &k.gvr == gvr && namespace.is_none_or(|ns| k.namespace == ns))
            .map(|(_, v)| v)
    }

    fn record(&mut self, key: &Key, before: Option<Value>, after: Option<Value>, object: Value) {
        self.history.push(Change {
            rv: self.rv,
            key: key.clone(),
            before,
            after,
            object,
        });
    }

    /// Stores `object` under `key` with the next resourceVersion and records the change.
    fn write(&mut self, key: &Key, mut object: Value) -> Value {
        self.rv += 1;
        meta(&mut object).insert("resourceVersion".into(), self.rv.to_string().into());
        let before = self.objects.insert(key.clone(), object.clone());
        self.record(key, before, Some(object.clone()), object.clone());
        object
    }

    /// Removes `key`, recording a deletion at the next resourceVersion.
    pub(crate) fn remove(&mut self, key: &Key) -> Option<Value> {
        let before = self.objects.remove(key)?;
        self.rv += 1;
        let mut object = before.clone();
        meta(&mut object).insert("resourceVersion".into(), self.rv.to_string().into());
        self.record(key, Some(before), None, object.clone());
        Some(object)
    }

    /// The name `generateName` makes: the prefix and five characters.
    fn generated_name(&mut self, prefix: &str) -> String {
        self.uids += 1;
        format!("{prefix}{:05x}", self.uids)
    }

    fn next_uid(&mut self) -> String {
        self.uids += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.uids)
    }

    /// POST to a collection: 409 AlreadyExists if the name is taken; uid, creationTimestamp
    /// and resourceVersion set; the namespace from the path. The status is kept as sent
    /// (upstream's strategies reset some, e.g. a pod's; a Node keeps it).
    pub(crate) fn create(
        &mut self,
        gvr: &Gvr,
        namespace: Option<&str>,
        mut object: Value,
    ) -> Result<Value, Box<Status>> {
        let given = object["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = if given.is_empty() {
            match object["metadata"]["generateName"].as_str() {
                Some(prefix) if !prefix.is_empty() => {
                    let prefix = prefix.to_string();
                    self.generated_name(&prefix)
                }
                _ => {
                    return Err(Box::new(status(
                        422,
                        "Invalid",
                        format!(
                            "{} \"\" is invalid: metadata.name: Required value",
                            gvr.qualified()
                        ),
                    )));
                }
            }
        } else {
            given
        };
        let key = Key {
            gvr: gvr.clone(),
            namespace: namespace.unwrap_or("").to_string(),
            name: name.clone(),
        };
        if self.objects.contains_key(&key) {
            return Err(Box::new(status(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", gvr.qualified()),
            )));
        }
        let uid = self.next_uid();
        let m = meta(&mut object);
        m.insert("name".into(), name.into());
        if let Some(ns) = namespace {
            m.insert("namespace".into(), ns.into());
        }
        m.insert("uid".into(), uid.into());
        m.insert(
            "creationTimestamp".into(),
            timestamp(crate::base::clock::timestamp()).into(),
        );
        Ok(self.write(&key, object))
    }

    /// The stored object a PUT or PATCH applies to: 404 if missing, 409 Conflict when `given`
    /// (the body or the patch) names a resourceVersion other than the stored one.
    fn current_unless_stale(&self, key: &Key, given: &Value) -> Result<Value, Box<Status>> {
        let current = self
            .objects
            .get(key)
            .ok_or_else(|| Box::new(not_found(key)))?
            .clone();
        if let Some(rv) = rv_of(given)
            && Some(rv) != rv_of(&current)
        {
            return Err(Box::new(conflict(key, STALE)));
        }
        Ok(current)
    }

    /// PUT: 404 if missing, 409 Conflict if the object's resourceVersion is given and stale;
    /// uid and creationTimestamp kept. A write that changes nothing keeps the version.
    pub(crate) fn update(
        &mut self,
        key: &Key,
        part: Part,
        object: Value,
    ) -> Result<Value, Box<Status>> {
        let current = self.current_unless_stale(key, &object)?;
        let next = self.merge_part(key, part, &current, object);
        Ok(self.write_if_changed(key, &current, next))
    }

    /// PATCH with a JSON merge patch (see [`super::patch`]); a resourceVersion in the patch
    /// is a precondition, as upstream's.
    pub(crate) fn patch(
        &mut self,
        key: &Key,
        part: Part,
        patch: &Value,
    ) -> Result<Value, Box<Status>> {
        let current = self.current_unless_stale(key, patch)?;
        let mut patched = current.clone();
        super::patch::merge(&mut patched, patch);
        let next = self.merge_part(key, part, &current, patched);
        Ok(self.write_if_changed(key, &current, next))
    }

    /// The object after a write of `part`: the status subresource changes only the status;
    /// the main resource leaves the status of resources that have the subresource. Identity
    /// (uid, creationTimestamp, name, namespace) never changes.
    fn merge_part(&self, key: &Key, part: Part, current: &Value, written: Value) -> Value {
        let mut next = match part {
            Part::Status => {
                let mut next = current.clone();
                next["status"] = written["status"].clone();
                next
            }
            Part::Main => {
                let mut next = written;
                if key.gvr.has_status_subresource() {
                    match current.get("status") {
                        Some(s) => next["status"] = s.clone(),
                        None => {
                            if let Some(o) = next.as_object_mut() {
                                o.remove("status");
                            }
                        }
                    }
                }
                next
            }
        };
        let m = meta(&mut next);
        for field in ["uid", "creationTimestamp", "name", "namespace"] {
            match current["metadata"].get(field) {
                Some(v) => m.insert(field.into(), v.clone()),
                None => m.remove(field),
            };
        }
        next
    }

    fn write_if_changed(&mut self, key: &Key, current: &Value, mut next: Value) -> Value {
        meta(&mut next).insert(
            "resourceVersion".into(),
            current["metadata"]["resourceVersion"].clone(),
        );
        if &next == current {
            return next;
        }
        self.write(key, next)
    }

    /// DELETE with its options: a uid or resourceVersion precondition that does not hold is
    /// 409 Conflict. An object with finalizers, or a pod bound to a node with a grace period
    /// (the options', else its `terminationGracePeriodSeconds`, else 30) is marked deleting
    /// (`deletionTimestamp`, `deletionGracePeriodSeconds`) and stays; otherwise it goes.
    /// Returns the object as the answer carries it.
    pub(crate) fn delete(&mut self, key: &Key, options: &Value) -> Result<Value, Box<Status>> {
        let current = self
            .objects
            .get(key)
            .ok_or_else(|| Box::new(not_found(key)))?
            .clone();
        let pre = &options["preconditions"];
        if let Some(uid) = pre["uid"].as_str() {
            let have = current["metadata"]["uid"].as_str().unwrap_or("");
            if uid != have {
                let why = format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                );
                return Err(Box::new(conflict(key, &why)));
            }
        }
        if let Some(rv) = pre["resourceVersion"].as_str()
            && Some(rv) != rv_of(&current)
        {
            let have = rv_of(&current).unwrap_or("");
            let why = format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have}"
            );
            return Err(Box::new(conflict(key, &why)));
        }
        let grace = options["gracePeriodSeconds"]
            .as_i64()
            .or_else(|| current["spec"]["terminationGracePeriodSeconds"].as_i64())
            .unwrap_or(30);
        let bound_pod = key.gvr.group.is_empty()
            && key.gvr.resource == "pods"
            && current["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty());
        let finalizers = current["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        let already = !current["metadata"]["deletionTimestamp"].is_null();
        if finalizers || (bound_pod && grace > 0 && !already) {
            if already {
                return Ok(current);
            }
            let mut next = current.clone();
            let at =
                crate::base::clock::timestamp() + jiff::SignedDuration::from_secs(grace.max(0));
            let m = meta(&mut next);
            m.insert("deletionTimestamp".into(), timestamp(at).into());
            m.insert("deletionGracePeriodSeconds".into(), grace.max(0).into());
            return Ok(self.write(key, next));
        }
        Ok(self.remove(key).expect("present"))
    }

    /// Creates or replaces `object` as someone else would (a test's hand): no precondition.
    pub(crate) fn apply(&mut self, key: &Key, mut object: Value) -> Value {
        match self.objects.get(key).cloned() {
            None => {
                let uid = self.next_uid();
                let m = meta(&mut object);
                m.insert("name".into(), key.name.clone().into());
                if !key.namespace.is_empty() {
                    m.insert("namespace".into(), key.namespace.clone().into());
                }
                if !m.contains_key("uid") {
                    m.insert("uid".into(), uid.into());
                }
                if !m.contains_key("creationTimestamp") {
                    m.insert(
                        "creationTimestamp".into(),
                        timestamp(crate::base::clock::timestamp()).into(),
                    );
                }
                self.write(key, object)
            }
            Some(current) => {
                let m = meta(&mut object);
                for field in ["uid", "creationTimestamp"] {
                    if !m.contains_key(field)
                        && let Some(v) = current["metadata"].get(field)
                    {
                        m.insert(field.into(), v.clone());
                    }
                }
                self.write(key, object)
            }
        }
    }

    /// Forgets the history: watches from an older resourceVersion get 410 Gone.
    pub(crate) fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
    }
}
