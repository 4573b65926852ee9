//! PostgreSQL's binary `numeric` (`numeric_send`): a digit count, a weight, a sign and a
//! display scale, 16 bits each, then base-10000 digits, most significant first. Read into an
//! unscaled decimal, or into the text the server prints.

use std::fmt::Write;

/// A binary `numeric`, checked as the server's `numeric_recv` checks it.
pub(super) struct Numeric<'a> {
    weight: i32,
    sign: u16,
    dscale: usize,
    /// Base-10000 digits, two bytes each.
    digits: &'a [u8],
}

impl<'a> Numeric<'a> {
    const POSITIVE: u16 = 0x0000;
    const NEGATIVE: u16 = 0x4000;
    const NAN: u16 = 0xC000;
    const INFINITY: u16 = 0xD000;
    const NEGATIVE_INFINITY: u16 = 0xF000;

    pub(super) fn read(v: &'a [u8]) -> Option<Self> {
        let word = |i: usize| v.get(i..i + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
        // Unsigned: a numeric has up to 147,455 decimal digits, 36,864 base-10000 ones.
        let ndigits = usize::from(word(0)?);
        let weight = i32::from(word(2)? as i16);
        let (sign, dscale) = (word(4)?, usize::from(word(6)?));
        let digits = v.get(8..)?;
        let well_formed = digits.len() == 2 * ndigits
            && dscale <= 0x3fff
            && [Self::POSITIVE, Self::NEGATIVE, Self::NAN, Self::INFINITY, Self::NEGATIVE_INFINITY].contains(&sign)
            && digits.chunks_exact(2).all(|d| u16::from_be_bytes([d[0], d[1]]) < 10_000);
        well_formed.then_some(Self { weight, sign, dscale, digits })
    }

    /// Digit `i` (0 is the most significant), 0 outside those sent.
    fn digit(&self, i: i32) -> u16 {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.digits.get(2 * i..2 * i + 2))
            .map_or(0, |d| u16::from_be_bytes([d[0], d[1]]))
    }

    /// Digit `i` of the value the server reads (`numeric_recv` cuts places past `dscale`).
    fn kept_digit(&self, i: i32) -> u16 {
        let digit = self.digit(i);
        // Places of this group within `dscale` (a group of the whole part has all four).
        let places_before = 4 * (i - self.weight - 1);
        match self.dscale as i32 - places_before {
            k if k >= 4 => digit,
            k if k <= 0 => 0,
            k => digit - digit % 10u16.pow((4 - k) as u32),
        }
    }

    /// Whether the value is zero once cut to `dscale` (the server keeps no negative zero).
    fn is_zero(&self) -> bool {
        (0..(self.digits.len() / 2) as i32).all(|i| self.kept_digit(i) == 0)
    }

    /// The value unscaled at `scale` places, when it is a number with no more places than that
    /// and fewer than `precision` digits; anything else goes through its text (a misfit there).
    pub(super) fn unscaled(&self, precision: u8, scale: u8) -> Option<i128> {
        if self.sign != Self::POSITIVE && self.sign != Self::NEGATIVE {
            return None;
        }
        let mut value: i128 = 0;
        for i in 0..(self.digits.len() / 2) as i32 {
            let digit = i128::from(self.kept_digit(i));
            // This digit counts 10000^(weight - i), so 10^(4 (weight - i) + scale) unscaled.
            let exponent = 4 * (self.weight - i) + i32::from(scale);
            let part = if exponent >= 0 {
                digit.checked_mul(10i128.checked_pow(exponent as u32)?)?
            } else {
                let divisor = 10i128.checked_pow(exponent.unsigned_abs()).unwrap_or(i128::MAX);
                if digit % divisor != 0 {
                    return None;
                }
                digit / divisor
            };
            value = value.checked_add(part)?;
        }
        let value = if self.sign == Self::NEGATIVE { -value } else { value };
        crate::schema::fits_precision(value, precision).then_some(value)
    }

    /// The text PostgreSQL prints (`get_str_from_var`): the whole part without leading zeros,
    /// then exactly `dscale` places.
    pub(super) fn text(&self) -> String {
        match self.sign {
            Self::NAN => return "NaN".into(),
            Self::INFINITY => return "Infinity".into(),
            Self::NEGATIVE_INFINITY => return "-Infinity".into(),
            _ => {}
        }
        let mut out = String::with_capacity(8 + 4 * (self.digits.len() / 2) + self.dscale);
        if self.sign == Self::NEGATIVE && !self.is_zero() {
            out.push('-');
        }
        if self.weight < 0 {
            out.push('0');
        } else {
            for i in 0..=self.weight {
                let digit = self.digit(i);
                let _ = if i == 0 { write!(out, "{digit}") } else { write!(out, "{digit:04}") };
            }
        }
        if self.dscale > 0 {
            out.push('.');
            let places = out.len();
            // Digit `weight + 1` counts 10000^-1; for a value below 1 the digits before the
            // first one sent are zeros.
            let mut i = self.weight + 1;
            while out.len() - places < self.dscale {
                let _ = write!(out, "{:04}", self.digit(i));
                i += 1;
            }
            out.truncate(places + self.dscale);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::decode::copy_binary::{Wire, fit_binary, native, text_of};
    use crate::schema::{ColumnType, Fit, fit_text};

    /// `unscaled / 10^scale` as PostgreSQL sends it: base-10000 groups with leading and
    /// trailing zero groups stripped, zero as no digits.
    fn numeric(unscaled: i128, scale: u16) -> Vec<u8> {
        let magnitude = unscaled.unsigned_abs().to_string();
        let places = usize::from(scale);
        let padded = format!("{magnitude:0>width$}", width = places + 1);
        let (whole, fraction) = padded.split_at(padded.len() - places);
        let whole = format!("{whole:0>width$}", width = whole.len().div_ceil(4) * 4);
        let fraction = format!("{fraction:0<width$}", width = fraction.len().div_ceil(4) * 4);
        let group = |g: &[u8]| std::str::from_utf8(g).unwrap().parse::<u16>().unwrap();
        let mut digits: Vec<u16> = whole.as_bytes().chunks(4).chain(fraction.as_bytes().chunks(4)).map(group).collect();
        let mut weight = whole.len() as i16 / 4 - 1;
        while digits.first() == Some(&0) {
            digits.remove(0);
            weight -= 1;
        }
        while digits.last() == Some(&0) {
            digits.pop();
        }
        let sign: u16 = if unscaled < 0 { 0x4000 } else { 0 };
        if digits.is_empty() {
            weight = 0;
        }
        let mut out = Vec::new();
        for word in [digits.len() as u16, weight as u16, sign, scale].into_iter().chain(digits) {
            out.extend(word.to_be_bytes());
        }
        out
    }

    #[test]
    fn numerics_read_as_postgresql_prints_them() {
        let cases: [(i128, u16, &str); 10] = [
            (123_456, 2, "1234.56"),
            (-5, 2, "-0.05"),
            (0, 2, "0.00"),
            (0, 0, "0"),
            (123_456_789, 1, "12345678.9"),
            (1_234, 8, "0.00001234"),
            (10i128.pow(20), 0, "100000000000000000000"),
            (-99_999_999_999_999_999_999_999_999_999_999_999_999, 10, "-9999999999999999999999999999.9999999999"),
            (100_000_000, 4, "10000.0000"),
            (7, 20, "0.00000000000000000007"),
        ];
        for (unscaled, scale, text) in cases {
            let v = numeric(unscaled, scale);
            assert_eq!(text_of(Wire::Numeric, &v).unwrap(), text, "{unscaled} at {scale}");
            assert_eq!(native(Wire::Numeric, ColumnType::Decimal(38, scale as u8), &v), Some(Fit::Decimal(unscaled)));
            // The same as the text path, at a wider scale and where it does not fit.
            for ty in [ColumnType::Decimal(38, 20), ColumnType::Decimal(4, 2), ColumnType::Decimal(38, 0)] {
                assert_eq!(
                    fit_binary(Wire::Numeric, ty, &v),
                    Some(fit_text(ty, text).into_owned()),
                    "{text} as {ty:?}"
                );
            }
            assert_eq!(fit_binary(Wire::Numeric, ColumnType::Double, &v), Some(fit_text(ColumnType::Double, text)));
        }
        // 1.230 sent with three places fits two; 1.234 does not.
        assert_eq!(native(Wire::Numeric, ColumnType::Decimal(6, 2), &numeric(1_230, 3)), Some(Fit::Decimal(123)));
        assert_eq!(native(Wire::Numeric, ColumnType::Decimal(6, 2), &numeric(1_234, 3)), None);
        let special = |sign: u16| [0u16, 0, sign, 0].iter().flat_map(|w| w.to_be_bytes()).collect::<Vec<u8>>();
        assert_eq!(text_of(Wire::Numeric, &special(0xC000)).unwrap(), "NaN");
        assert_eq!(text_of(Wire::Numeric, &special(0xD000)).unwrap(), "Infinity");
        assert_eq!(text_of(Wire::Numeric, &special(0xF000)).unwrap(), "-Infinity");
        assert!(matches!(
            fit_binary(Wire::Numeric, ColumnType::Decimal(12, 2), &special(0xC000)),
            Some(Fit::Misfit(_))
        ));
        // Not a numeric: a digit of 10000 or more, a count that disagrees with the bytes, a sign
        // that is none of the five.
        let mut big = numeric(1, 0);
        big[8..10].copy_from_slice(&10_000u16.to_be_bytes());
        assert_eq!(text_of(Wire::Numeric, &big), None);
        assert_eq!(text_of(Wire::Numeric, &numeric(123_456, 2)[..11]), None);
        assert_eq!(text_of(Wire::Numeric, &special(0x8000)), None);
        assert_eq!(text_of(Wire::Numeric, &[0, 0]), None);
    }

    /// A numeric from its header words and base-10000 digits, as they are.
    fn raw(weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
        let header = [digits.len() as u16, weight as u16, sign, dscale];
        header.iter().chain(digits).flat_map(|w| w.to_be_bytes()).collect()
    }

    #[test]
    fn the_largest_numerics_and_what_the_server_would_cut() {
        // 32,768 groups of 9999: more digits than an i16 counts (PostgreSQL's count is unsigned).
        let nines = raw(32_767, 0, 0, &[9999; 32_768]);
        let text = text_of(Wire::Numeric, &nines).unwrap();
        assert_eq!((text.len(), text.bytes().all(|b| b == b'9')), (131_072, true));
        assert!(matches!(fit_binary(Wire::Numeric, ColumnType::Decimal(38, 0), &nines), Some(Fit::Misfit(_))));
        // Places past the display scale are cut, as `numeric_recv` cuts them: 1.2345 shown
        // with 2 places is 1.23 in both forms.
        let cut = raw(0, 0, 2, &[1, 2345]);
        assert_eq!(text_of(Wire::Numeric, &cut).unwrap(), "1.23");
        assert_eq!(native(Wire::Numeric, ColumnType::Decimal(6, 4), &cut), Some(Fit::Decimal(12_300)));
        // No negative zero, even one that is zero only once cut.
        assert_eq!(text_of(Wire::Numeric, &raw(0, 0x4000, 2, &[])).unwrap(), "0.00");
        assert_eq!(text_of(Wire::Numeric, &raw(-1, 0x4000, 2, &[1])).unwrap(), "0.00");
        assert_eq!(text_of(Wire::Numeric, &raw(-1, 0x4000, 4, &[1])).unwrap(), "-0.0001");
    }

    proptest::proptest! {
        /// Any well-formed numeric: its DECIMAL is the one its text gives, at every precision
        /// and scale, fit or misfit; its text is a sign, digits, and exactly `dscale` places.
        #[test]
        fn a_numeric_decimal_is_its_text_decimal(
            weight in proptest::prop_oneof![-12i16..12, proptest::num::i16::ANY],
            sign in proptest::sample::select(vec![0u16, 0x4000, 0xC000, 0xD000, 0xF000]),
            dscale in proptest::prop_oneof![0u16..40, 0u16..0x4000],
            digits in proptest::collection::vec(0u16..10_000, 0..12),
        ) {
            let v = raw(weight, sign, dscale, &digits);
            let text = text_of(Wire::Numeric, &v).unwrap().into_owned();
            for ty in [ColumnType::Decimal(38, 0), ColumnType::Decimal(38, 10), ColumnType::Decimal(12, 2),
                ColumnType::Decimal(38, 38), ColumnType::Decimal(1, 0)] {
                proptest::prop_assert_eq!(fit_binary(Wire::Numeric, ty, &v), Some(fit_text(ty, &text).into_owned()));
            }
            if sign == 0 || sign == 0x4000 {
                let unsigned = text.strip_prefix('-').unwrap_or(&text);
                let (whole, places) = unsigned.split_once('.').unwrap_or((unsigned, ""));
                proptest::prop_assert!(!whole.is_empty(), "{}", text);
                proptest::prop_assert_eq!(places.len(), usize::from(dscale));
                proptest::prop_assert!(unsigned.bytes().all(|b| b.is_ascii_digit() || b == b'.'));
            }
        }
    }
}
