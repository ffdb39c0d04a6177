//! Shared helpers for the host tests live in tests/common.
