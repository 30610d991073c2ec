"""memtrace.importers"""
