"""memtrace.capture"""
