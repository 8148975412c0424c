//! The server's embedded durable key-value store.
