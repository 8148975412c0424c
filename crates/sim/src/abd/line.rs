//! What the world writes in a line: a value's 8 bytes, repeated, so that a torn line is told
//! from any line some write wrote.

use pmnet_abd::LINE;

/// The bytes of a line holding `value`: its 8 bytes, 8 times (0 is the line every node
/// starts with).
pub(super) fn line_bytes(value: u64) -> [u8; LINE] {
    let mut line = [0; LINE];
    for chunk in line.chunks_mut(8) {
        chunk.copy_from_slice(&value.to_be_bytes());
    }
    line
}

/// The value a line's bytes hold, if they are a line some write wrote.
pub(super) fn line_value(bytes: &[u8]) -> Option<u64> {
    let value = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
    (bytes.len() == LINE && bytes == line_bytes(value)).then_some(value)
}
