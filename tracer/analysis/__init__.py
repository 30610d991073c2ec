"""memtrace.analysis"""
