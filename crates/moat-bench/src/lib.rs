//! moat-bench (being written).
