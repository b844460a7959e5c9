"""kvsplit.tuner"""
