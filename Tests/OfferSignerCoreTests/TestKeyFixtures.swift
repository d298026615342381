// TEST FIXTURES ONLY: throwaway keys generated with openssl for these tests.
// They were never registered anywhere and sign nothing real.

enum TestKeyFixtures {
    static let rsa = """
    -----BEGIN PRIVATE KEY-----
    MIICdgIBADANBgkqhkiG9w0BAQEFAASCAmAwggJcAgEAAoGBALa6LtgVHkCwJ2Ty
    tkgO7JwqIyjYPMPH+NMG+5TBlnkAZRnP3Rkg6xeSnnH5F8ArECdyxOCYPLjxbY0r
    2PIX4Ofgoi19EwTOSOK+fVLddQx9JSZsNunghjkU5DRgu6LvmT5CreLq+G8Y+0ft
    UKkzE4MHZXEDOtuRk87w5I6C9yiDAgMBAAECgYBpm195iXMLpgOOp2xMZzu+4eei
    Mp+j845OwKlkhyIlWuITsfwyCsF0xUuHyZQ9f2X9tqosuC/YH8jWH3JqMPzNa/5U
    GG85ktxSd0RMYP8kcpfKhsdT56nGy/nN1pDBvWLI0Htelouf9v76aR6IxwbG4DG7
    t3YoUJ01S5rMjj10CQJBAO2Sh1/1md227W20IIPMpV/22rDx4VCkYWHazIPkdfG6
    d2brkkaCNSD419ehVKlCp75gV1dqVF4raW+hjrYidC0CQQDE5piHwjH7wawwYt8/
    8bK2SNRqf0g/3+gOoHiZ/GvFv8C/Kx1/8WoGnZFl1IR0MOKXc2PAjRkP8Pa7FPik
    co1vAkArZg0c1nzZJ8WPuMwHx6aeNTYWBNmoJZ80hQe/QEjbc7jEMFx0TOzvrQWg
    +nPAx9Bk0qyh52aqHTwRjG3Jj9mxAkBXgPdGVeoqrQ5dzoLSgxJd6g3kaj5sjJAv
    d+dA36nxjt8U1g9dHad12y6Tp5dZn6QDlHc/SjVaHUc5Kv+47WOnAkEAl2yL1tPY
    JgkDVQf/DtSeJiQ7Qw8p9ohkxwKI2Z9nDYjvlFWyNC1pKU5jM+sAChrCQImHJeni
    mXIJt/ztiknZIQ==
    -----END PRIVATE KEY-----
    """

    static let p384 = """
    -----BEGIN PRIVATE KEY-----
    MIG2AgEAMBAGByqGSM49AgEGBSuBBAAiBIGeMIGbAgEBBDBl0qZ1JIGHs/DrxTge
    4EYxyyTG9ZogGuEbjOt/IZiBIy4s/9PZeBB9hUxGsEpRRsWhZANiAARlFPCTFGJJ
    krZPO1UXnGLouH61QwzzIjVVXOfz4nWMGJ7+6/Ti4OkXP1oz8sULN8NumKpifLVJ
    mE20Rdjy4t0tVslcPohBJxykyuGJTaQTuIdp8bA7WB6EhFVt8MaGyRw=
    -----END PRIVATE KEY-----
    """

    static let ed25519 = """
    -----BEGIN PRIVATE KEY-----
    MC4CAQAwBQYDK2VwBCIEIFDUwkpFJLVl2wFwVuVK451qyG4YuFFuxpbHElaBYgEO
    -----END PRIVATE KEY-----
    """

    static let p256 = """
    -----BEGIN PRIVATE KEY-----
    MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgEI9E3v70u43jr9jJ
    MJ2A96qaKT0AyhwGMKAQ9ZYGYJGhRANCAARrSzXF9W1jwZavpFyg5CIOX25s8M19
    lk2nbi4Z5X0geRMu+bt6RZTDyCmW4nbkhAVMe5awKF5OmDt5ZRYBj8XY
    -----END PRIVATE KEY-----
    """

    static let encrypted = """
    -----BEGIN ENCRYPTED PRIVATE KEY-----
    MIHsMFcGCSqGSIb3DQEFDTBKMCkGCSqGSIb3DQEFDDAcBAj7ojbCKCmNpgICCAAw
    DAYIKoZIhvcNAgkFADAdBglghkgBZQMEASoEEBaSTu38tMiZsAhbEoML3M0EgZDU
    Vjn/XB6YaesvTQxsisdnoILLlPH6NP5PYBIpBbQkClCvgeu1IED6CPL/UQj1kv8F
    tLpxx2cwgzkbE475ju9W2c3p9zg1+cQWso4oygNm+QBJKHPHjm1A3XksAiXl6cE6
    DBwibhZpvKG7lrzruxQ3dU1zJdC2cUpcD/oMZtQhIa5d5efjSJmCj9QfeiFtbQo=
    -----END ENCRYPTED PRIVATE KEY-----
    """

    static let sec1 = """
    -----BEGIN EC PRIVATE KEY-----
    MHcCAQEEIBCPRN7+9LuN46/YyTCdgPeqmik9AMocBjCgEPWWBmCRoAoGCCqGSM49
    AwEHoUQDQgAEa0s1xfVtY8GWr6RcoOQiDl9ubPDNfZZNp24uGeV9IHkTLvm7ekWU
    w8gpluJ25IQFTHuWsCheTpg7eWUWAY/F2A==
    -----END EC PRIVATE KEY-----
    """

    static let secp256k1 = """
    -----BEGIN PRIVATE KEY-----
    MIGEAgEAMBAGByqGSM49AgEGBSuBBAAKBG0wawIBAQQgHe+kB53qTO059c1uy4W/
    wEBjYw3wEIUu4CgtsYFb9a2hRANCAATzXs7fi2N17CWNJZlucIoqhIAZ0Mq7hWMv
    LQU5PB6b9zcQ2WyFF//3vMbxgtkNH3ypMyVzG6A3JW6A8i56Kx7b
    -----END PRIVATE KEY-----
    """

    /// The public half of `p256`.
    static let p256Public = """
    -----BEGIN PUBLIC KEY-----
    MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEa0s1xfVtY8GWr6RcoOQiDl9ubPDN
    fZZNp24uGeV9IHkTLvm7ekWUw8gpluJ25IQFTHuWsCheTpg7eWUWAY/F2A==
    -----END PUBLIC KEY-----
    """
}
