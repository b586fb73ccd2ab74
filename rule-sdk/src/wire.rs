//! How a batch of events and its verdicts cross the ABI, written once for the SDK and the agent
//! (the layout is `decide`'s, in wit/rule.wit): numbers in lists of 32-bit words, strings
//! appended to one text and named by spans of it (where they start, and their length).

use std::borrow::Cow;

use crate::{Event, Severity, Verdict};

/// Words an event takes in `decide`'s `events`.
pub const EVENT_WORDS: usize = 16;
/// Words a verdict takes in `verdicts`.
const VERDICT_WORDS: usize = 3;
const KEEP: u32 = 1;
const KILL: u32 = 2;
const SEVERITY_SHIFT: u32 = 8;
/// Severities by their number in a verdict's flags, from 1.
const SEVERITIES: [Severity; 5] = [
    Severity::Info,
    Severity::Low,
    Severity::Medium,
    Severity::High,
    Severity::Critical,
];

/// Appends `field` to `text` and its span to `words`.
fn append(text: &mut String, words: &mut Vec<u32>, field: &str) {
    words.extend([text.len() as u32, field.len() as u32]);
    text.push_str(field);
}

/// The string of the span `start`, `len` of `text`; None if it is not all in it, or does not
/// begin and end between characters.
// Inline: `events`, which calls it for every field, is compiled in the module's crate.
#[inline]
fn get(text: &str, start: u32, len: u32) -> Option<&str> {
    let start = start as usize;
    start
        .checked_add(len as usize)
        .and_then(|end| text.get(start..end))
}

/// `event` as the agent passes it to a module: with its JSON only if the module reads it
/// (`Rule::READS_JSON`), "" otherwise.
pub fn as_passed(event: Event<'_>, reads_json: bool) -> Event<'_> {
    Event {
        json: if reads_json { event.json } else { "" },
        ..event
    }
}

/// The bytes of text an event's strings take, at most.
pub fn text_len(event: &Event<'_>) -> usize {
    fields(event).iter().map(|field| field.len()).sum()
}

/// Strings an event has.
const FIELDS: usize = 7;

/// An event's strings, in the order they cross.
fn fields<'a>(event: &Event<'a>) -> [&'a str; FIELDS] {
    [
        event.hook,
        event.action,
        event.policy,
        event.rule,
        event.comm,
        event.path,
        event.json,
    ]
}

/// A batch of events as `decide` takes them, built one event after another. A string that is
/// the previous event's (the same one in memory: a hook's name, a policy's) is named by the
/// same span instead of crossing again.
pub struct Batch<'a> {
    pub text: String,
    pub words: Vec<u32>,
    /// The previous event's strings, and their spans.
    previous: [(&'a str, [u32; 2]); FIELDS],
}

impl<'a> Batch<'a> {
    /// Room for `events` events whose strings take `text` bytes at most.
    pub fn with_capacity(events: usize, text: usize) -> Self {
        Self {
            text: String::with_capacity(text),
            words: Vec::with_capacity(events * EVENT_WORDS),
            previous: [("", [0, 0]); FIELDS],
        }
    }

    pub fn push(&mut self, event: &Event<'a>) {
        for (field, previous) in fields(event).into_iter().zip(&mut self.previous) {
            if !std::ptr::eq(field, previous.0) {
                let start = self.text.len() as u32;
                self.text.push_str(field);
                *previous = (field, [start, field.len() as u32]);
            }
            self.words.extend(previous.1);
        }
        self.words.extend([event.pid, event.uid]);
    }
}

/// The events of a batch. A span outside `text` (which the agent never passes) reads as "".
pub fn events<'a>(text: &'a str, words: &'a [u32]) -> impl Iterator<Item = Event<'a>> {
    words.chunks_exact(EVENT_WORDS).map(move |event| {
        let field = |index: usize| get(text, event[2 * index], event[2 * index + 1]).unwrap_or("");
        Event {
            hook: field(0),
            action: field(1),
            policy: field(2),
            rule: field(3),
            comm: field(4),
            path: field(5),
            json: field(6),
            pid: event[14],
            uid: event[15],
        }
    })
}

/// Verdicts as `decide` returns them (the fields of its `verdicts` record).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Packed {
    pub verdicts: Vec<u32>,
    pub text: String,
    pub tags: Vec<u32>,
    pub annotations: Vec<u32>,
}

impl Packed {
    /// Room for the words of `verdicts` verdicts; their text grows as it comes.
    pub fn with_capacity(verdicts: usize) -> Self {
        Self {
            verdicts: Vec::with_capacity(verdicts * VERDICT_WORDS),
            ..Self::default()
        }
    }

    /// Appends the next event's verdict.
    pub fn push(&mut self, verdict: &Verdict) {
        let severity = verdict.severity.map_or(0, |severity| severity as u32 + 1);
        let flags = (u32::from(verdict.keep) * KEEP)
            | (u32::from(verdict.kill) * KILL)
            | (severity << SEVERITY_SHIFT);
        self.verdicts.extend([
            flags,
            verdict.tags.len() as u32,
            verdict.annotations.len() as u32,
        ]);
        for tag in &verdict.tags {
            append(&mut self.text, &mut self.tags, tag);
        }
        for (key, value) in &verdict.annotations {
            append(&mut self.text, &mut self.annotations, key);
            append(&mut self.text, &mut self.annotations, value);
        }
    }
}

/// The verdicts `packed` holds; an error saying what does not fit if its spans, counts or
/// flags do not fit the lists and text they index.
pub fn unpack(packed: &Packed) -> Result<Vec<Verdict>, String> {
    let Packed {
        verdicts,
        text,
        tags,
        annotations,
    } = packed;
    if verdicts.len() % VERDICT_WORDS != 0 || tags.len() % 2 != 0 || annotations.len() % 4 != 0 {
        return Err("lists of a length their items do not fill".to_owned());
    }
    // The string of the span at `spans[at..]`.
    let field = |spans: &[u32], at: usize| -> Result<Cow<'static, str>, String> {
        get(text, spans[at], spans[at + 1])
            .map(|field| field.to_owned().into())
            .ok_or_else(|| "a span outside their text".to_owned())
    };
    // Words of `tags` and `annotations` read so far.
    let (mut tag_at, mut annotation_at) = (0, 0);
    let mut unpacked = Vec::with_capacity(verdicts.len() / VERDICT_WORDS);
    for verdict in verdicts.chunks_exact(VERDICT_WORDS) {
        let [flags, tag_count, annotation_count] = [verdict[0], verdict[1], verdict[2]];
        if flags & !(KEEP | KILL | 0xff << SEVERITY_SHIFT) != 0 {
            return Err(format!("unknown flags {flags:#x}"));
        }
        let severity = match (flags >> SEVERITY_SHIFT) as usize {
            0 => None,
            number => Some(
                *SEVERITIES
                    .get(number - 1)
                    .ok_or_else(|| format!("unknown severity {number}"))?,
            ),
        };
        let (tag_count, annotation_count) = (tag_count as usize, annotation_count as usize);
        if tag_count > (tags.len() - tag_at) / 2
            || annotation_count > (annotations.len() - annotation_at) / 4
        {
            return Err("more tags or annotations counted than listed".to_owned());
        }
        let mut verdict = Verdict {
            keep: flags & KEEP != 0,
            severity,
            tags: Vec::with_capacity(tag_count),
            annotations: Vec::with_capacity(annotation_count),
            kill: flags & KILL != 0,
        };
        for _ in 0..tag_count {
            verdict.tags.push(field(tags, tag_at)?);
            tag_at += 2;
        }
        for _ in 0..annotation_count {
            let key = field(annotations, annotation_at)?;
            verdict
                .annotations
                .push((key, field(annotations, annotation_at + 2)?));
            annotation_at += 4;
        }
        unpacked.push(verdict);
    }
    if tag_at < tags.len() || annotation_at < annotations.len() {
        return Err("tags or annotations no verdict counts".to_owned());
    }
    Ok(unpacked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_cross_as_they_were_pushed() {
        let event = Event {
            hook: "file_open",
            action: "deny",
            policy: "app",
            rule: "protect-files/protected-files",
            pid: 7,
            uid: 1000,
            comm: "cat",
            path: "/srv/secrets/tökén",
            json: "{\"hook\":\"file_open\"}",
        };
        let other = Event {
            path: "/etc/shadow",
            ..event
        };
        assert_eq!(as_passed(event, true), event);
        assert_eq!(as_passed(event, false), Event { json: "", ..event });
        let mut batch = Batch::with_capacity(2, text_len(&event) + text_len(&other));
        for event in [&event, &other] {
            batch.push(event);
        }
        // The strings `other` took from `event` crossed once.
        assert_eq!(batch.text.len(), text_len(&event) + other.path.len());
        assert_eq!(
            events(&batch.text, &batch.words).collect::<Vec<_>>(),
            [event, other]
        );
        // A span outside the text, or inside a character, reads as "".
        let words = [[0, 99], [15, 2]].concat();
        let mut words = [words.as_slice(), &[0; EVENT_WORDS - 4]].concat();
        words[14] = 1;
        let read: Vec<_> = events("/srv/secrets/tökén", &words).collect();
        assert_eq!((read[0].hook, read[0].action, read[0].pid), ("", "", 1));
    }

    fn pack(verdicts: &[Verdict]) -> Packed {
        let mut packed = Packed::with_capacity(verdicts.len());
        for verdict in verdicts {
            packed.push(verdict);
        }
        packed
    }

    #[test]
    fn verdicts_unpack_as_they_were_packed_and_malformed_ones_are_refused() {
        let verdicts = vec![
            Verdict::keep(),
            Verdict::drop().severity(Severity::Critical),
            Verdict::keep()
                .severity(Severity::Info)
                .tag("a")
                .tag("b")
                .annotate("attempt", "cat (uid 0) on /srv/secrets/token")
                .kill(),
            Verdict::keep().annotate("", ""),
        ];
        assert_eq!(unpack(&pack(&verdicts)), Ok(verdicts));

        let packed = pack(&[Verdict::keep().tag("tag").annotate("key", "value")]);
        let malformed = |change: fn(&mut Packed)| {
            let mut packed = packed.clone();
            change(&mut packed);
            unpack(&packed)
        };
        for (what, change) in [
            (
                "a span outside the text",
                (|p| p.tags[0] = 99) as fn(&mut Packed),
            ),
            ("a span inside a character", |p| {
                p.text = "tagkeyvalu€".to_owned()
            }),
            ("more counted than listed", |p| p.verdicts[1] = 2),
            ("listed and not counted", |p| p.verdicts[2] = 0),
            ("a list cut short", |p| {
                p.annotations.pop();
            }),
            ("an unknown severity", |p| {
                p.verdicts[0] |= 6 << SEVERITY_SHIFT
            }),
            ("an unknown flag", |p| p.verdicts[0] |= 4),
        ] {
            assert!(malformed(change).is_err(), "{what}");
        }
    }
}
