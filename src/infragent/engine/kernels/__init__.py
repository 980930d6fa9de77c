"""The engine's native CPU kernels (C++ on torch's thread pool), compiled once per machine on first use."""
