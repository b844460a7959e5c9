"""kvsplit.db"""
