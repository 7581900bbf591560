"""The primitives: abstract evaluation, lowering to the FFI targets,
differentiation, batching and sharding rules, one file per family."""
