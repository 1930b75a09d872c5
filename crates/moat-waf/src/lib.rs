//! moat-waf (being written).
