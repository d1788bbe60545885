//! Reading the crate's production code as text, for the tests that hold the tree to its shape
//! (`module_graph.rs`: which layer may use which; `function_length.rs`: how long a function
//! may be; `one_clock.rs`: where time is read).
//!
//! Production code is every file under `src/` except test code: a module declared under
//! `#[cfg(test)]` in a file of its own (`#[cfg(test)] mod tests;`, with or without `#[path]`),
//! and any item marked `#[cfg(test)]` inline (a `mod tests { … }`, a helper function, a `use`).
//! Comments and the insides of string and character literals are blanked first (newlines kept,
//! so offsets still give line numbers), so braces and paths in them are never read as code.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One production source file.
pub struct SourceFile {
    /// The path below `src/`, e.g. `kubelet/runtime/inspect.rs`.
    pub rel: PathBuf,
    /// The module path of the file, e.g. `["kubelet", "runtime", "inspect"]` (empty for lib.rs).
    pub module: Vec<String>,
    /// The file as written.
    pub text: String,
    /// The file with comments, literals and `#[cfg(test)]` items blanked.
    pub code: String,
}

impl SourceFile {
    /// The 1-based line of a byte offset.
    pub fn line_of(&self, offset: usize) -> usize {
        self.text[..offset].matches('\n').count() + 1
    }

    /// The written line `n` (1-based), trimmed.
    pub fn line(&self, n: usize) -> &str {
        self.text.lines().nth(n - 1).unwrap_or("").trim()
    }
}

pub fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every production file of the crate (test-only files left out), sorted by path.
pub fn production_files() -> Vec<SourceFile> {
    let src = src_dir();
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    paths.sort();
    let texts: Vec<(PathBuf, String)> = paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    let test_only: BTreeSet<PathBuf> = texts
        .iter()
        .flat_map(|(p, t)| test_module_files(p, &blank_comments_and_literals(t)))
        .collect();
    texts
        .into_iter()
        .filter(|(p, _)| !test_only.contains(p) && !p.ends_with("main.rs"))
        .map(|(p, text)| {
            let rel = p.strip_prefix(&src).unwrap().to_path_buf();
            let code = blank_test_items(&blank_comments_and_literals(&text));
            SourceFile {
                module: module_of(&rel),
                rel,
                text,
                code,
            }
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `kubelet/runtime/mod.rs` → `[kubelet, runtime]`; `base/yaml.rs` → `[base, yaml]`.
pub fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The files that `#[cfg(test)] mod x;` declarations in `file` bring in (`pub mod x;` and
/// `pub(crate) mod x;` too: a test helper other modules' tests share needs a visibility).
pub fn test_module_files(file: &Path, code: &str) -> Vec<PathBuf> {
    let dir = file.parent().unwrap();
    let stem = file.file_stem().unwrap().to_string_lossy();
    // A non-mod file's child modules live in a directory named after it.
    let child_dir = if stem == "mod" || stem == "lib" {
        dir.to_path_buf()
    } else {
        dir.join(stem.as_ref())
    };
    let mut out = Vec::new();
    for (start, _) in code.match_indices("#[cfg(test)]") {
        let rest = &code[start + "#[cfg(test)]".len()..];
        let (attrs, item) = split_attributes(rest);
        let item = ["pub(crate) ", "pub "]
            .iter()
            .find_map(|v| item.strip_prefix(v))
            .unwrap_or(item);
        let Some(decl) = item.strip_prefix("mod ") else {
            continue;
        };
        let name: String = decl
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !decl[name.len()..].trim_start().starts_with(';') {
            continue;
        }
        // `#[path = "…"]` is blanked with the literals, so read it from the raw attributes'
        // position in the original text instead: same offsets.
        let raw = std::fs::read_to_string(file).unwrap();
        let raw_attrs = &raw[start..start + "#[cfg(test)]".len() + attrs];
        if let Some(p) = raw_attrs.split("#[path = \"").nth(1) {
            out.push(dir.join(p.split('"').next().unwrap()));
        } else {
            out.push(child_dir.join(format!("{name}.rs")));
            out.push(child_dir.join(&name).join("mod.rs"));
        }
    }
    out
}

/// The length of the attributes (and white space) at the start of `rest`, and what follows.
fn split_attributes(rest: &str) -> (usize, &str) {
    let mut i = 0;
    loop {
        let trimmed = rest[i..].trim_start();
        i = rest.len() - trimmed.len();
        if trimmed.starts_with("#[") {
            i += end_of_group(&rest[i + 1..], '[', ']') + 2;
        } else {
            return (i, &rest[i..]);
        }
    }
}

/// The offset of the bracket that closes the group opened at `text[0]`.
pub fn end_of_group(text: &str, open: char, close: char) -> usize {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return i;
            }
        }
    }
    text.len().saturating_sub(1)
}

/// Blanks every item marked `#[cfg(test)]`: up to its `;` or the end of its first braced
/// block. Newlines are kept.
pub fn blank_test_items(code: &str) -> String {
    let mut out = code.to_string();
    let mut from = 0;
    while let Some(found) = out[from..].find("#[cfg(test)]") {
        let start = from + found;
        let after = start + "#[cfg(test)]".len();
        let end = after + item_len(&out[after..]);
        let blanked = blank(&out[start..end]);
        out.replace_range(start..end, &blanked);
        from = end;
    }
    out
}

/// The length of the next item in `text` (attributes included): to its `;` or its block's `}`.
pub fn item_len(text: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            ';' if depth == 0 => return i + 1,
            _ => {}
        }
    }
    text.len()
}

fn blank(text: &str) -> String {
    // Byte offsets are kept: a multi-byte character becomes as many spaces.
    text.chars()
        .map(|c| {
            if c == '\n' {
                "\n".to_string()
            } else {
                " ".repeat(c.len_utf8())
            }
        })
        .collect()
}

/// The text with comments and the contents of string and character literals replaced by
/// spaces (byte offsets and newlines kept; the quotes stay).
pub fn blank_comments_and_literals(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = 0;
    let wipe = |out: &mut Vec<u8>, from: usize, to: usize| {
        for b in &mut out[from..to] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    };
    while i < bytes.len() {
        let rest = &bytes[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            wipe(&mut out, i, i + end);
            i += end;
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            let mut j = i;
            while j < bytes.len() {
                if bytes[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if bytes[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            wipe(&mut out, i, j);
            i = j;
        } else if let Some(len) = raw_string_len(bytes, i) {
            wipe(&mut out, i + 1, i + len - 1);
            i += len;
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            wipe(&mut out, i + 1, j.min(bytes.len()));
            i = j + 1;
        } else if bytes[i] == b'\'' {
            i += char_literal_len(text, i).map_or(1, |len| {
                wipe(&mut out, i + 1, i + len - 1);
                len
            });
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn is_ident_byte_before(bytes: &[u8], i: usize) -> bool {
    i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')
}

/// `r"…"`, `r#"…"#`, `br"…"`: the literal's length when one starts at `i`.
fn raw_string_len(bytes: &[u8], i: usize) -> Option<usize> {
    if is_ident_byte_before(bytes, i) {
        return None;
    }
    let mut j = i;
    if bytes.get(j) == Some(&b'b') {
        j += 1;
    }
    if bytes.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = bytes[j..].iter().take_while(|&&b| b == b'#').count();
    j += hashes;
    if bytes.get(j) != Some(&b'"') {
        return None;
    }
    let closing: Vec<u8> = std::iter::once(b'"')
        .chain(std::iter::repeat_n(b'#', hashes))
        .collect();
    let body = j + 1;
    let end = bytes[body..]
        .windows(closing.len())
        .position(|w| w == closing.as_slice())?;
    Some(body + end + closing.len() - i)
}

/// A character literal at `i` (`'x'`, `'\n'`, `'\u{1F600}'`), not a lifetime (`'a`).
fn char_literal_len(text: &str, i: usize) -> Option<usize> {
    let rest = &text[i + 1..];
    if let Some(escaped) = rest.strip_prefix('\\') {
        let close = escaped.find('\'')?;
        return Some(close + 3);
    }
    let c = rest.chars().next()?;
    rest[c.len_utf8()..]
        .starts_with('\'')
        .then_some(c.len_utf8() + 2)
}
