//! Which TCP connections a process holds, read from `/proc` (Linux).
//!
//! Neither the Redis nor the AMQP consumer of the ledger names its
//! connections, and all of them come from 127.0.0.1; what tells the
//! consumer's connections apart from anyone else's (this suite's admin
//! connection, other tests, other consumers) is the client port. The
//! process's socket inodes (`/proc/PID/fd`) are matched against the kernel's
//! connection tables (`/proc/net/tcp`, `tcp6`), which give the ports.

use std::collections::HashSet;
use std::fs;

/// The local ports of `pid`'s TCP connections to `remote_port` (a broker's
/// port), as the broker sees them: the client's `peer_port`.
pub fn client_ports(pid: u32, remote_port: u16) -> Result<HashSet<u16>, String> {
    let inodes = socket_inodes(pid)?;
    let mut ports = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue; // No IPv6 on this machine.
        };
        // Columns: sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
        for row in text.lines().skip(1) {
            let columns: Vec<&str> = row.split_whitespace().collect();
            let (Some(local), Some(remote), Some(inode)) =
                (columns.get(1), columns.get(2), columns.get(9))
            else {
                continue;
            };
            if !inodes.contains(*inode) || port_of(remote) != Some(remote_port) {
                continue;
            }
            if let Some(port) = port_of(local) {
                ports.insert(port);
            }
        }
    }
    Ok(ports)
}

/// The inodes of `pid`'s open sockets (`socket:[INODE]` links in its fd
/// directory).
fn socket_inodes(pid: u32) -> Result<HashSet<String>, String> {
    let directory = format!("/proc/{pid}/fd");
    let entries =
        fs::read_dir(&directory).map_err(|error| format!("cannot list {directory}: {error}"))?;
    Ok(entries
        .filter_map(|entry| fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect())
}

/// The port of an address column, `0100007F:18EB` (hex, after the colon).
fn port_of(address: &str) -> Option<u16> {
    let (_, port) = address.rsplit_once(':')?;
    u16::from_str_radix(port, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_this_process_s_own_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let server_port = listener.local_addr().expect("address").port();
        let client = std::net::TcpStream::connect(("127.0.0.1", server_port)).expect("connect");
        let client_port = client.local_addr().expect("address").port();
        let ports = client_ports(std::process::id(), server_port).expect("read /proc");
        assert!(
            ports.contains(&client_port),
            "{ports:?} lacks {client_port}"
        );
    }
}
