//! Property tests of the HTTP/1.1 wire code (written next).
