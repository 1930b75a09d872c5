//! moat-schema (being written).
