-- Fencing tokens come from a sequence, taken in the statement that takes the lock:
-- nextval() is never rolled back, so a token is never issued twice, even by a transaction
-- that aborts, and it waits for no one (a row per key would make each holder wait for the
-- row lock of the previous holder's open transaction).
CREATE SEQUENCE pgsolo.fencing_token_seq;
