//! How the tables write figures: a cell, thousands separated, a ratio rounded.

pub(super) fn cell(value: Option<f64>) -> String {
    match value {
        Some(value) if value >= 1000.0 => format!("{value:.0}"),
        Some(value) => format!("{value:.1}"),
        None => "-".to_owned(),
    }
}

/// `1234567.0` as `1,234,567`.
pub fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

pub(super) fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some((a / b * 1000.0).round() / 1000.0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1234567.0), "1,234,567");
    }
}
