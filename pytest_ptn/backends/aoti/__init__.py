"""The AOTInductor backends: per-method compiled libraries, cached on disk, sharing constants by content."""
