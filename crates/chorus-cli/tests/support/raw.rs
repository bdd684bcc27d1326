//! Raw sockets for tests of clients the HTTP client library cannot play:
//! ones that never read.

use std::net::{SocketAddr, TcpStream};

/// Opens a socket whose receive buffer is as small as the kernel allows, so
/// a client that never reads stops the server's writes soon.
pub fn connect_with_small_receive_buffer(address: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(v4) = address else {
        panic!("a loopback IPv4 address: {address}")
    };
    // SAFETY: plain socket calls on a descriptor this function owns; the
    // stream takes it over.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let size: libc::c_int = 1024;
        let set = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
        assert_eq!(set, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
        let peer = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let connected = libc::connect(
            fd,
            (&peer as *const libc::sockaddr_in).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(connected, 0, "connect: {}", std::io::Error::last_os_error());
        TcpStream::from_raw_fd(fd)
    }
}

/// The socket address of a server at `url` (`http://<address>`).
pub fn socket_address(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .parse()
        .unwrap_or_else(|e| panic!("not http://<socket address>: {url}: {e}"))
}

/// A client that sends `request` to the server at `url` and then never
/// reads: its receive window closes, and the server's writes stop.
pub fn never_reading(url: &str, request: &str) -> TcpStream {
    use std::io::Write;
    let mut stream = connect_with_small_receive_buffer(socket_address(url));
    stream
        .write_all(request.as_bytes())
        .expect("the request is sent");
    stream
}
