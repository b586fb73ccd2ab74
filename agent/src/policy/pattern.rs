//! Path patterns of file and exec rules, checked and reduced to what the kernel tries can match.

use palisade_common::KEY_PATH_LEN;

const KEY_LEN: usize = KEY_PATH_LEN as usize;

/// A path pattern:
/// - `/etc/shadow`: exactly that file;
/// - `/etc/` or `/etc/**`: everything below the directory;
/// - `PREFIX**SUFFIX`, e.g. `/proc/**/mem`: paths that start with PREFIX and end with SUFFIX,
///   where `**` stands for any characters, `/` included (`/**/` also matches a single `/`).
///
/// Patterns start with `/`, or with `@` for the abstract names of UNIX sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    Exact(String),
    Prefix(String),
    Glob { prefix: String, suffix: String },
}

impl Pattern {
    pub fn parse(pattern: &str) -> Result<Self, String> {
        if !pattern.starts_with(['/', '@']) {
            return Err(format!("\"{pattern}\" is not an absolute path"));
        }
        if pattern.contains('\0') {
            return Err(format!("\"{pattern}\" contains a NUL byte"));
        }
        if pattern.contains("//") {
            return Err(format!(
                "\"{pattern}\" contains an empty path component (\"//\")"
            ));
        }
        if pattern.split('/').any(|part| part == "." || part == "..") {
            return Err(format!(
                "\"{pattern}\" contains a \".\" or \"..\" component"
            ));
        }
        let pieces: Vec<&str> = pattern.split("**").collect();
        if pieces.len() > 2 {
            return Err(format!("\"{pattern}\" has more than one \"**\""));
        }
        if pieces.iter().any(|piece| piece.contains(['*', '?', '['])) {
            return Err(format!(
                "\"{pattern}\": only the \"**\" wildcard is supported (no \"*\", \"?\" or \"[\")"
            ));
        }
        let parsed = match pieces.as_slice() {
            [path] if path.ends_with('/') => Pattern::Prefix((*path).to_owned()),
            [path] => Pattern::Exact((*path).to_owned()),
            [prefix, ""] => Pattern::Prefix((*prefix).to_owned()),
            [prefix, suffix] => Pattern::Glob {
                prefix: (*prefix).to_owned(),
                suffix: (*suffix).to_owned(),
            },
            _ => unreachable!("split yields one or two pieces here"),
        };
        parsed.check_lengths(pattern)?;
        Ok(parsed)
    }

    fn check_lengths(&self, pattern: &str) -> Result<(), String> {
        let too_long = |len: usize| len > KEY_LEN;
        let long = match self {
            Pattern::Exact(path) => too_long(path.len() + 1),
            Pattern::Prefix(prefix) => too_long(prefix.len()),
            Pattern::Glob { prefix, suffix } => too_long(prefix.len()) || too_long(suffix.len()),
        };
        if long {
            return Err(format!(
                "\"{pattern}\" is too long: paths, prefixes and suffixes are limited to {} bytes",
                KEY_LEN - 1
            ));
        }
        Ok(())
    }

    /// For a glob: the shortest path it matches (without the NUL).
    pub fn min_len(prefix: &str, suffix: &str) -> usize {
        let shared_slash = prefix.ends_with('/') && suffix.starts_with('/');
        prefix.len() + suffix.len() - usize::from(shared_slash)
    }

    /// Whether `path` matches: the meaning of the pattern, which the compiler's tests check the
    /// kernel's tries against.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            Pattern::Exact(exact) => path == exact,
            Pattern::Prefix(prefix) => path.starts_with(prefix.as_str()),
            Pattern::Glob { prefix, suffix } => {
                path.len() >= Self::min_len(prefix, suffix)
                    && path.starts_with(prefix.as_str())
                    && path.ends_with(suffix.as_str())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_forms() {
        assert_eq!(
            Pattern::parse("/etc/shadow"),
            Ok(Pattern::Exact("/etc/shadow".into()))
        );
        assert_eq!(Pattern::parse("/etc/"), Ok(Pattern::Prefix("/etc/".into())));
        assert_eq!(
            Pattern::parse("/etc/**"),
            Ok(Pattern::Prefix("/etc/".into()))
        );
        assert_eq!(
            Pattern::parse("/proc/**/mem"),
            Ok(Pattern::Glob {
                prefix: "/proc/".into(),
                suffix: "/mem".into()
            })
        );
    }

    #[test]
    fn rejects_bad_patterns_with_the_reason() {
        assert_eq!(
            Pattern::parse("etc/x"),
            Err("\"etc/x\" is not an absolute path".into())
        );
        assert_eq!(
            Pattern::parse("/a/**/b/**"),
            Err("\"/a/**/b/**\" has more than one \"**\"".into())
        );
        assert_eq!(
            Pattern::parse("/home/*/x"),
            Err(
                "\"/home/*/x\": only the \"**\" wildcard is supported (no \"*\", \"?\" or \"[\")"
                    .into()
            )
        );
        assert_eq!(
            Pattern::parse("/a/../b"),
            Err("\"/a/../b\" contains a \".\" or \"..\" component".into())
        );
        assert_eq!(
            Pattern::parse("/a//b"),
            Err("\"/a//b\" contains an empty path component (\"//\")".into())
        );
        let long = format!("/{}", "x".repeat(251));
        assert!(Pattern::parse(&long).unwrap_err().contains("is too long"));
        assert!(Pattern::parse(&long[..251]).is_ok());
    }

    #[test]
    fn glob_matches_any_depth_and_the_empty_middle() {
        let glob = Pattern::parse("/proc/**/mem").unwrap();
        for path in ["/proc/mem", "/proc/1/mem", "/proc/1/task/2/mem"] {
            assert!(glob.matches(path), "{path}");
        }
        for path in ["/proc/1/mems", "/proc", "/proc/", "/sys/1/mem", "/procmem"] {
            assert!(!glob.matches(path), "{path}");
        }
        // The prefix and suffix may not overlap by more than the shared "/".
        let tricky = Pattern::parse("/x/y/**/y/z").unwrap();
        assert!(!tricky.matches("/x/y/z"));
        assert!(tricky.matches("/x/y/y/z"));
    }
}
