//! Stopping: gracefully (finish, settle, publish early) and by being killed.
