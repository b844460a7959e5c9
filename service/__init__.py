"""kvsplit.service"""
