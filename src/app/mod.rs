//! Layer 5: the program. [`daemon`] decides which clients, managers and endpoints a
//! configuration asks for and wires them together; [`cli`] holds the `deckhand` commands for
//! people; [`logging`] sets up the log format; [`heap_trim`] gives idle heap back to the kernel.

pub mod cli;
pub mod daemon;
pub(crate) mod heap_trim;
pub mod logging;
