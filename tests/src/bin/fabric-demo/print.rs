//! How the demo prints: step and detail lines, and the documents of `kubectl gpufabric`'s
//! library (the same `==>` steps, indented lines and tables).

use gpufabric_kubectl::doc::Doc;

pub(crate) fn step(msg: impl AsRef<str>) {
    println!("==> {}", msg.as_ref());
}

pub(crate) fn info(msg: impl AsRef<str>) {
    println!("    {}", msg.as_ref());
}

pub(crate) fn show(doc: &Doc) {
    print!("{}", doc.render());
}
