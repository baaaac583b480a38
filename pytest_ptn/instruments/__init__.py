"""How a rule observes a backend: equal values, the same bytes, memory growth, a call in a fresh process."""
