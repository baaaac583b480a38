"""The native backend: .ptn packages read by a small schema-checked reader and a pure-torch interpreter."""
