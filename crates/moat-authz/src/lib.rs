//! moat-authz (being written).
