//! No production function is longer than [`MAX_LINES`]: a function a reader cannot take in at
//! once hides its decisions. `scripts/longest-functions` prints the longest ones.

mod shape;

use shape::{SourceFile, production_files};

/// Lines from `fn` to the closing brace, inclusive.
const MAX_LINES: usize = 150;

/// How many of the longest functions the listing shows.
const LISTED: usize = 25;

struct Function {
    place: String,
    name: String,
    lines: usize,
}

/// The functions with a body in one file: each `fn name` to the brace that closes its body.
fn functions_of(file: &SourceFile) -> Vec<Function> {
    let code = &file.code;
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = code[from..].find("fn ") {
        let at = from + found;
        from = at + 3;
        let boundary = at == 0 || !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
        let name: String = code[at + 3..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !boundary || name.is_empty() {
            continue;
        }
        let Some(end) = body_end(&code[at..]) else {
            continue;
        };
        let first = file.line_of(at);
        let last = file.line_of(at + end);
        out.push(Function {
            place: format!("src/{}:{first}", file.rel.display()),
            name,
            lines: last - first + 1,
        });
    }
    out
}

/// The offset of the `}` that closes the body of the function starting at `text[0]`, or
/// `None` for a declaration without a body (`fn f();` in a trait).
fn body_end(text: &str) -> Option<usize> {
    let len = shape::item_len(text);
    text[..len].ends_with('}').then(|| len - 1)
}

fn all_functions() -> Vec<Function> {
    let mut all: Vec<Function> = production_files().iter().flat_map(functions_of).collect();
    all.sort_by(|a, b| b.lines.cmp(&a.lines).then(a.place.cmp(&b.place)));
    all
}

#[test]
fn no_production_function_is_longer_than_the_limit() {
    let all = all_functions();
    println!("the {LISTED} longest production functions (limit {MAX_LINES} lines):");
    for f in all.iter().take(LISTED) {
        println!("{:>5}  {}  {}", f.lines, f.name, f.place);
    }
    let over: Vec<String> = all
        .iter()
        .filter(|f| f.lines > MAX_LINES)
        .map(|f| format!("{} ({} lines) at {}", f.name, f.lines, f.place))
        .collect();
    assert!(
        over.is_empty(),
        "functions over {MAX_LINES} lines (split them):\n{}",
        over.join("\n")
    );
}

#[test]
fn the_reader_measures_a_body_and_skips_declarations() {
    let text = "trait T { fn a(&self); }\nfn b() {\n    let s = \"}\";\n    if x { y }\n}\n";
    let code = shape::blank_test_items(&shape::blank_comments_and_literals(text));
    let file = SourceFile {
        rel: "x.rs".into(),
        module: vec!["x".into()],
        text: text.into(),
        code,
    };
    let found: Vec<(String, usize)> = functions_of(&file)
        .into_iter()
        .map(|f| (f.name, f.lines))
        .collect();
    assert_eq!(found, vec![("b".to_string(), 4)]);
}

#[test]
fn test_items_are_not_production_code() {
    let text =
        "fn a() {}\n#[cfg(test)]\nmod tests {\n    fn long() { let c = '}'; }\n}\nfn b() {}\n";
    let code = shape::blank_test_items(&shape::blank_comments_and_literals(text));
    assert!(code.contains("fn a()") && code.contains("fn b()"));
    assert!(!code.contains("long"), "{code}");
}
