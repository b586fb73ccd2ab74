//! An audit event's JSON line, written by hand: byte for byte what `serde_json` writes for
//! `AuditEvent` (the derive stays, for the Falco sink and as this module's test oracle), at a
//! fraction of the cost: serde_json escapes every key of every event, which under a flood of
//! denials cost more than everything else the decoder does.

use super::{Added, AuditEvent, Device, Naming};

/// One JSON object being written, its fields in the order they are given.
struct Object<'a> {
    out: &'a mut Vec<u8>,
    empty: bool,
}

impl<'a> Object<'a> {
    fn open(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, empty: true }
    }

    /// Writes the members of an object whose braces are written elsewhere.
    fn members(out: &'a mut Vec<u8>) -> Self {
        Self { out, empty: true }
    }

    /// Goes on with an object whose fields `out` already ends with (its closing brace left off).
    fn resume(out: &'a mut Vec<u8>) -> Self {
        Self { out, empty: false }
    }

    /// Ends the previous field, if any.
    fn next(&mut self) -> &mut Vec<u8> {
        if !self.empty {
            self.out.push(b',');
        }
        self.empty = false;
        self.out
    }

    /// Writes `"key":` for one of the event's own keys: plain names, nothing to escape.
    // Inlined where the key is a literal, its copy is a few stores instead of a call.
    #[inline(always)]
    fn key(&mut self, key: &str) -> &mut Vec<u8> {
        let out = self.next();
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b"\":");
        out
    }

    /// A field whose key comes from elsewhere (a module's annotation), escaped.
    fn entry(&mut self, key: &str, value: &str) {
        let out = self.next();
        string(out, key);
        out.push(b':');
        string(out, value);
    }

    #[inline(always)]
    fn str(&mut self, key: &str, value: &str) {
        string(self.key(key), value);
    }

    /// A field whose string needs no escaping (see `plain`).
    #[inline(always)]
    fn plain(&mut self, key: &str, value: &str) {
        plain(self.key(key), value);
    }

    /// `null` for none, as serde writes an `Option` it does not skip.
    #[inline(always)]
    fn str_or_null(&mut self, key: &str, value: Option<&str>) {
        match value {
            Some(value) => self.str(key, value),
            None => self.key(key).extend_from_slice(b"null"),
        }
    }

    #[inline(always)]
    fn number(&mut self, key: &str, value: impl itoa::Integer) {
        let mut buffer = itoa::Buffer::new();
        let text = buffer.format(value);
        self.key(key).extend_from_slice(text.as_bytes());
    }

    /// A device, "major:minor".
    fn device(&mut self, key: &str, device: Device) {
        let out = self.key(key);
        out.push(b'"');
        out.extend_from_slice(itoa::Buffer::new().format(device.major()).as_bytes());
        out.push(b':');
        out.extend_from_slice(itoa::Buffer::new().format(device.minor()).as_bytes());
        out.push(b'"');
    }

    /// A list of strings, each written by `write`: `string`, or `plain` for the agent's own.
    fn strings<'s>(
        &mut self,
        key: &str,
        values: impl IntoIterator<Item = &'s str>,
        write: fn(&mut Vec<u8>, &str),
    ) {
        let out = self.key(key);
        out.push(b'[');
        for (index, value) in values.into_iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            write(out, value);
        }
        out.push(b']');
    }

    fn object(&mut self, key: &str) -> Object<'_> {
        Object::open(self.key(key))
    }

    fn close(self) {
        self.out.push(b'}');
    }
}

/// For each byte, the character after the backslash that escapes it (`u`: `\u00XX`), or 0.
const ESCAPE: [u8; 256] = {
    let mut table = [0; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = b'u';
        byte += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// Whether any of the 8 bytes of `word` needs escaping: is below 0x20, `"` or `\`.
fn any_escape(word: u64) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    // A byte's high bit ends up set where the byte was below `n` (for the bytes of `word`
    // that are below 0x80; the others have their own high bit, masked out by `!word`).
    let below = |word: u64, n: u64| word.wrapping_sub(ONES * n) & !word & HIGH;
    let equal = |word: u64, byte: u8| below(word ^ (ONES * u64::from(byte)), 1);
    (below(word, 0x20) | equal(word, b'"') | equal(word, b'\\')) != 0
}

/// Whether any byte of `bytes` needs escaping, looked at 8 bytes at a time (the last word may
/// overlap the one before it).
fn needs_escape(bytes: &[u8]) -> bool {
    let word = |at: usize| {
        let word: [u8; 8] = bytes[at..at + 8].try_into().expect("8 bytes");
        any_escape(u64::from_ne_bytes(word))
    };
    if bytes.len() < 8 {
        return bytes.iter().any(|&byte| ESCAPE[usize::from(byte)] != 0);
    }
    (0..bytes.len() / 8).any(|index| word(8 * index)) || word(bytes.len() - 8)
}

/// A JSON string with nothing to escape: one the agent made (a name from its tables, a time).
#[inline(always)]
fn plain(out: &mut Vec<u8>, value: &str) {
    debug_assert!(!needs_escape(value.as_bytes()));
    out.push(b'"');
    out.extend_from_slice(value.as_bytes());
    out.push(b'"');
}

/// A JSON string, escaped as serde_json escapes it.
fn string(out: &mut Vec<u8>, value: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = value.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // Most text has nothing to escape: one copy.
    if !needs_escape(bytes) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    for &byte in bytes {
        match ESCAPE[usize::from(byte)] {
            0 => out.push(byte),
            b'u' => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(byte >> 4)],
                HEX[usize::from(byte & 0xf)],
            ]),
            escape => out.extend_from_slice(&[b'\\', escape]),
        }
    }
    out.push(b'"');
}

impl Naming {
    /// The fields as the members of a JSON object.
    pub(super) fn members_json(&self) -> String {
        let mut out = Vec::with_capacity(256);
        let mut naming = Object::members(&mut out);
        naming.str("node", &self.node);
        naming.plain("hook", self.hook);
        naming.plain("action", self.action);
        naming.str_or_null("policy", self.policy.as_deref());
        naming.str_or_null("rule", self.rule.as_deref());
        naming.number("rule_id", self.rule_id);
        let mut target = naming.object("target");
        target.number("cgroup_id", self.target.cgroup_id);
        target.str_or_null("cgroup_path", self.target.cgroup_path.as_deref());
        target.close();
        String::from_utf8(out).expect("JSON of strings is UTF-8")
    }
}

impl AuditEvent {
    /// The event as the kernel reported it and the decoder named it: every field but `added`.
    pub(super) fn write_facts(&self, out: &mut Vec<u8>) {
        let mut event = Object::open(out);
        event.plain("time", self.time.as_str());
        event.next().extend_from_slice(self.naming.json.as_bytes());
        event.number("cgroup_id", self.cgroup_id);
        if let Some(pod) = &self.kubernetes {
            let mut kubernetes = event.object("kubernetes");
            kubernetes.str("namespace", &pod.namespace);
            kubernetes.str("pod", &pod.pod);
            if let Some(container) = &pod.container {
                kubernetes.str("container", container);
            }
            kubernetes.close();
        }
        event.number("pid", self.pid);
        event.number("tid", self.tid);
        event.number("uid", self.uid);
        event.str("comm", &self.comm);
        event.str("path", &self.path);
        event.device("dev", self.dev);
        event.number("ino", self.ino);
        event.strings("permissions", self.permissions.iter().copied(), plain);
        event.number("errno", self.errno);
        if self.suppressed != 0 {
            event.number("suppressed", self.suppressed);
        }
        if let Some(pid) = self.object_pid {
            event.number("object_pid", pid);
        }
        if let Some(signal) = self.signal {
            event.number("signal", signal);
        }
        if let Some(capability) = &self.capability {
            event.str("capability", capability);
        }
        if let Some(fs_type) = &self.fs_type {
            event.str("fs_type", fs_type);
        }
        if let Some(socket) = &self.socket {
            let mut object = event.object("socket");
            object.number("family", socket.family);
            object.number("protocol", socket.protocol);
            if let Some(address) = &socket.address {
                object.str("address", address);
            }
            if let Some(port) = socket.port {
                object.number("port", port);
            }
            object.close();
        }
        if let Some(rdev) = self.rdev {
            event.device("rdev", rdev);
        }
        if let Some(arg) = self.arg {
            event.number("arg", arg);
        }
        event.close();
    }

    /// Appends the whole event as one JSON object, as `serde_json` would write it, without
    /// writing its facts again.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        // The facts' object without its closing brace, then what modules added.
        match self.facts.get() {
            Some(facts) => out.extend_from_slice(facts.as_bytes()),
            None => self.write_facts(out),
        }
        out.pop();
        let mut event = Object::resume(out);
        let Added {
            severity,
            tags,
            annotations,
            killed,
        } = &self.added;
        if let Some(severity) = severity {
            event.plain("severity", severity);
        }
        if !tags.is_empty() {
            event.strings("tags", tags.iter().map(String::as_str), string);
        }
        if !annotations.is_empty() {
            let mut object = event.object("annotations");
            for (key, value) in annotations {
                object.entry(key, value);
            }
            object.close();
        }
        if *killed {
            event.key("killed").extend_from_slice(b"true");
        }
        event.close();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn strings_are_escaped_as_serde_escapes_them_wherever_the_escape_falls() {
        let mut texts = vec![String::new(), "/srv/secrets/token".to_owned()];
        for at in 0..20 {
            for special in ['"', '\\', '\n', '\u{0}', '\u{1f}', '\u{7f}', 'é', '€', ' '] {
                let mut text: String = "/a/clean/prefix/of/text".chars().take(at).collect();
                text.push(special);
                text.push_str("/and/more/after/it");
                texts.push(text);
            }
        }
        for text in texts {
            let mut out = Vec::new();
            super::string(&mut out, &text);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(&text).unwrap(),
                "{text:?}"
            );
        }
    }
}
