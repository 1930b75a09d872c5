//! moat-proxy (being written).
