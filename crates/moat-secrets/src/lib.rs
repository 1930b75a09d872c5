//! moat-secrets (being written).
