//! moat-tls (being written).
