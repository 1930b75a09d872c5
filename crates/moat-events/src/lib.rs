//! moat-events (being written).
