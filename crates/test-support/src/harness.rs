//! End-to-end harness: real `drover` binary, real home, real sockets.
